package e2e

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// requestLineRE finds, in tcpdump -nn -e -A output, the header line of a
// packet that carries the request: its interface index and source.
var requestLineRE = regexp.MustCompile(`(?m)^\S+ +\S+ +In +ifindex (\d+) .*?: (\S+) > \S+: Flags .*HTTP: GET /capture-e2e HTTP/1.1$`)

// checkCapture runs the installed `cni-usernet capture` of a pod on this
// node, as an operator would, during a request from the node, and reads the
// file back with tcpdump: the request must be there on two interfaces of
// the pod (the wire leg's eth0 and the app leg's lo), from the same client
// address and port. (The request line, not the SYN: the node's HTTP client
// may reuse the connection the Traffic check opened.)
func checkCapture(t *testing.T, ns, pod, podIP string) {
	file := filepath.Join(t.TempDir(), pod+".pcapng")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, installed, "capture", "-w", file, "--duration", "6s", ns+"/"+pod)
	stderr := &nettest.LockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	err := poll(10*time.Second, func() error {
		if !strings.Contains(stderr.String(), "capturing") {
			return errors.New("not capturing yet")
		}
		return nil
	})
	if err != nil {
		cancel()
		<-done
		t.Fatalf("capture did not start: %v\n%s", err, stderr.String())
	}
	body, err := httpGet("http://" + net.JoinHostPort(podIP, "8080") + "/capture-e2e")
	if err != nil {
		t.Errorf("node -> %s HTTP during the capture: %v", pod, err)
	} else {
		wantHTTP(t, "node -> "+pod+" during the capture", body, pod, "")
	}
	if err := <-done; err != nil {
		t.Fatalf("cni-usernet capture: %v\n%s", err, stderr.String())
	}
	t.Logf("cni-usernet capture said:\n%s", stderr.String())
	out, err := exec.Command("tcpdump", "-nn", "-e", "-A", "-r", file).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -r %s: %v\n%s", file, err, out)
	}
	legs := map[string]string{} // ifindex -> client
	for _, m := range requestLineRE.FindAllStringSubmatch(string(out), -1) {
		legs[m[1]] = m[2]
		t.Logf("request on ifindex %s from %s", m[1], m[2])
	}
	if len(legs) != 2 || legs["1"] == "" {
		t.Fatalf("the request is on interfaces %v, want the wire leg's and lo (ifindex 1):\n%.4000s", legs, out)
	}
	for idx, from := range legs {
		if from != legs["1"] {
			t.Errorf("the request comes from %s on ifindex %s and from %s on lo: the client's address and port differ between the legs", from, idx, legs["1"])
		}
	}
}
