// Package metrics holds the root test of the node agent's Prometheus
// endpoint: a real agent, real attachments made by the real
// plugin, real traffic, and a real scrape checked with promlint (the
// linter of `promtool check metrics`) and, when built, promtool itself.
package metrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/cni-usernet/cni-usernet/test/lib/promcheck"
)

// metricsAddr is the agent's endpoint on the node namespace's loopback.
const metricsAddr = "127.0.0.1:9437"

func TestScrape(t *testing.T) {
	env := nettest.NewEnv(t)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	soft := env.NewPod(env.Conf("1.0.0", map[string]any{"gso": "software"}))
	off := env.NewPod(env.Conf("1.0.0", map[string]any{"gso": "off"}))
	if err := env.Check(soft.Conf, soft.ID, soft.NS); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	startAgent(t, env)

	const size = 1 << 20
	for _, p := range []*nettest.Pod{soft, off} {
		echo(t, env, p, size)
	}

	// The agent collects on its own schedule: a collection after the
	// echoes.
	body := waitFor(t, env, "the echoes in the scrape", func(fams map[string]*dto.MetricFamily) error {
		for _, p := range []*nettest.Pod{soft, off} {
			f := (&promcheck.Scrape{Families: fams}).Find("cni_usernet_pod_tcp_connections_total", map[string]string{"container_id": p.ID})
			if len(f) != 1 || promcheck.Value(f[0]) < 1 {
				return fmt.Errorf("%s relayed TCP connections: %v, want 1", p.ID, f)
			}
		}
		return nil
	})
	fams := body.Families
	lint(t, body)
	for _, tc := range []struct {
		pod  *nettest.Pod
		mode string
	}{{soft, "software"}, {off, "off"}} {
		id := tc.pod.ID
		for _, leg := range []string{"wire", "app"} {
			for _, dir := range []string{"ingress", "egress"} {
				v, labels := value(t, fams, "cni_usernet_pod_bytes_total", map[string]string{"container_id": id, "leg": leg, "direction": dir})
				// The echo moved size bytes each way: payload on the app
				// leg, more (headers) on the wire.
				if v < size {
					t.Errorf("%s bytes %s/%s: got %.0f, want ≥ %d", id, leg, dir, v, size)
				}
				if labels["gso_mode"] != tc.mode || labels["namespace"] != "test" || labels["pod"] != id || labels["interface"] != "eth0" {
					t.Errorf("%s labels: got %v, want gso_mode %s, namespace test, pod %s, interface eth0", id, labels, tc.mode, id)
				}
			}
		}
		// The node's kernel sends the veth TSO bursts of up to 64 KiB.
		for _, dir := range []string{"ingress", "egress"} {
			if v, _ := value(t, fams, "cni_usernet_pod_packets_total", map[string]string{"container_id": id, "direction": dir}); v < size/(64<<10) {
				t.Errorf("%s wire %s packets: got %.0f, want ≥ %d", id, dir, v, size/(64<<10))
			}
		}
		if v, _ := value(t, fams, "cni_usernet_pod_stack_up", map[string]string{"container_id": id}); v != 1 {
			t.Errorf("%s stack_up: got %v, want 1", id, v)
		}
		if v, _ := value(t, fams, "cni_usernet_pod_tcp_connections_total", map[string]string{"container_id": id}); v != 1 {
			t.Errorf("%s relayed TCP connections: got %v, want 1", id, v)
		}
		if v, _ := value(t, fams, "cni_usernet_pod_stack_resident_memory_bytes", map[string]string{"container_id": id}); v < 1<<20 {
			t.Errorf("%s stack RSS: got %.0f bytes, want ≥ 1 MiB", id, v)
		}
		if v, _ := value(t, fams, "cni_usernet_pod_stack_cpu_seconds_total", map[string]string{"container_id": id}); v <= 0 {
			t.Errorf("%s stack CPU: got %v s, want > 0", id, v)
		}
		if _, labels := value(t, fams, "cni_usernet_pod_gso_info", map[string]string{"container_id": id}); labels["requested"] != tc.mode {
			t.Errorf("%s gso_info requested: got %q, want %q", id, labels["requested"], tc.mode)
		}
	}
	// Software GSO hands the link batches; off never does.
	if v, _ := value(t, fams, "cni_usernet_pod_gso_batches_total", map[string]string{"container_id": soft.ID}); v == 0 {
		t.Errorf("software GSO batches: got 0, want > 0")
	}
	if v, _ := value(t, fams, "cni_usernet_pod_gso_batches_total", map[string]string{"container_id": off.ID}); v != 0 {
		t.Errorf("GSO off batches: got %v, want 0", v)
	}
	if v, _ := value(t, fams, "cni_usernet_attachments", nil); v != 2 {
		t.Errorf("attachments: got %v, want 2", v)
	}
	if v := histCount(t, fams, "ADD", "success"); v != 2 {
		t.Errorf("ADD successes: got %d, want 2", v)
	}
	if v := histCount(t, fams, "CHECK", "success"); v != 1 {
		t.Errorf("CHECK successes: got %d, want 1", v)
	}
	if v, _ := value(t, fams, "cni_usernet_reconcile_runs_total", nil); v < 1 {
		t.Errorf("reconcile runs: got %v, want ≥ 1", v)
	}
	if v, _ := value(t, fams, "cni_usernet_agent_starts_total", nil); v != 1 {
		t.Errorf("agent starts: got %v, want 1", v)
	}

	// DEL: the pod's series go with it.
	if err := env.Del(off.Conf, off.ID, off.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	// The agent collects on its own schedule: the next collection.
	body = waitFor(t, env, "the deleted pod's series gone", func(fams map[string]*dto.MetricFamily) error {
		if f := (&promcheck.Scrape{Families: fams}).Find("cni_usernet_pod_stack_up", map[string]string{"container_id": off.ID}); len(f) != 0 {
			return fmt.Errorf("series of the deleted pod %s still scraped", off.ID)
		}
		return nil
	})
	fams = body.Families
	if strings.Contains(string(body.Body), off.ID) {
		t.Errorf("series of the deleted pod %s still scraped:\n%s", off.ID, body.Grep(off.ID))
	}
	if !strings.Contains(string(body.Body), soft.ID) {
		t.Errorf("series of the remaining pod %s gone", soft.ID)
	}
	if v := histCount(t, fams, "DEL", "success"); v != 1 {
		t.Errorf("DEL successes: got %d, want 1", v)
	}
	if v, _ := value(t, fams, "cni_usernet_attachments", nil); v != 1 {
		t.Errorf("attachments after DEL: got %v, want 1", v)
	}
	t.Logf("scrape sample:\n%s", body.Grep("cni_usernet_pod_bytes_total"))
}

// TestScrapeRestartAndReclaim: a killed stack shows up as a restart (on
// the pod and on the node), and a pod whose namespace vanished without a
// DEL as a reclaimed attachment whose series are gone.
func TestScrapeRestartAndReclaim(t *testing.T) {
	env := nettest.NewEnv(t)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	conf := env.Conf("1.0.0", nil)
	// A pod the test loses by hand: its namespace is not NewPod's.
	lostNS, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Add(conf, "lost-pod", lostNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Del(conf, "lost-pod", nil) }) // if the agent did not reclaim it
	pod := env.NewPod(conf)
	startAgent(t, env, "--reconcile-interval", "1s")

	store := state.Store{Dir: filepath.Join(env.Dir, "state")}
	att, err := store.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(att.StackPID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the stack: %v", err)
	}
	waitFor(t, env, "the restart in the scrape", func(fams map[string]*dto.MetricFamily) error {
		s := &promcheck.Scrape{Families: fams}
		r := s.Find("cni_usernet_pod_stack_restarts_total", map[string]string{"container_id": pod.ID})
		up := s.Find("cni_usernet_pod_stack_up", map[string]string{"container_id": pod.ID})
		node := s.Find("cni_usernet_stack_restarts_total", map[string]string{"result": "success"})
		if len(r) != 1 || promcheck.Value(r[0]) != 1 || len(up) != 1 || promcheck.Value(up[0]) != 1 || len(node) != 1 || promcheck.Value(node[0]) != 1 {
			return fmt.Errorf("pod restarts %v, stack_up %v, node restarts %v; want 1, 1, 1", r, up, node)
		}
		return nil
	})

	lost, err := store.Load("lost-pod", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	// The stack holds the namespace open; killing it and unmounting the
	// namespace is what a runtime crash leaves.
	syscall.Kill(lost.StackPID, syscall.SIGKILL)
	lostNS.Close()
	if err := unix.Unmount(lostNS.Path(), unix.MNT_DETACH); err != nil {
		t.Fatalf("unmounting %s: %v", lostNS.Path(), err)
	}
	os.Remove(lostNS.Path())
	s := waitFor(t, env, "the reclaim in the scrape", func(fams map[string]*dto.MetricFamily) error {
		s := &promcheck.Scrape{Families: fams}
		var reclaimed float64
		for _, m := range s.Find("cni_usernet_reclaimed_attachments_total", nil) {
			reclaimed += promcheck.Value(m)
		}
		if left := s.Find("cni_usernet_pod_stack_up", map[string]string{"container_id": "lost-pod"}); reclaimed != 1 || len(left) != 0 {
			return fmt.Errorf("reclaimed %v, lost pod's series %v; want 1 and none", reclaimed, left)
		}
		return nil
	})
	lint(t, s)
	if v, _ := value(t, s.Families, "cni_usernet_attachments", nil); v != 1 {
		t.Errorf("attachments: got %v, want 1", v)
	}
}

// waitFor scrapes until ok accepts the scrape (10 s at most).
func waitFor(t *testing.T, env *nettest.Env, what string, ok func(map[string]*dto.MetricFamily) error) *promcheck.Scrape {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		s, fams := scrape(t, env)
		if err = ok(fams); err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// echo sends n bytes through an echo server in pod p from the node and
// reads them back: traffic on both legs, both ways.
func echo(t *testing.T, env *nettest.Env, p *nettest.Pod, n int) {
	t.Helper()
	ln := nettest.Listen(t, p.NS, "tcp", ":7000")
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := nettest.Dial(env.Node, "tcp", nettest.HostPort(p.IP(4), 7000), 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", p.ID, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() {
		c.Write(bytes.Repeat([]byte("m"), n))
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || len(got) != n {
		t.Fatalf("echo through %s: got %d bytes, %v; want %d", p.ID, len(got), err, n)
	}
}

// scrape GETs the agent's /metrics in the node namespace.
func scrape(t *testing.T, env *nettest.Env) (*promcheck.Scrape, map[string]*dto.MetricFamily) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nettest.Dial(env.Node, network, addr, 5*time.Second)
		},
	}}
	s, err := promcheck.Get(client, "http://"+metricsAddr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return s, s.Families
}

// lint checks the scrape with promlint and, when built, promtool.
func lint(t *testing.T, s *promcheck.Scrape) {
	t.Helper()
	problems, checked, err := s.Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("checked with %s", checked)
}

// value returns the one sample of family name whose labels include want,
// and all its labels.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, map[string]string) {
	t.Helper()
	if _, ok := fams[name]; !ok {
		t.Fatalf("no %s in the scrape", name)
	}
	found := (&promcheck.Scrape{Families: fams}).Find(name, want)
	if len(found) != 1 {
		t.Fatalf("%s%v: got %d samples, want 1", name, want, len(found))
	}
	return promcheck.Value(found[0]), promcheck.Labels(found[0])
}

// histCount is the number of plugin operations recorded for verb and
// result (0 when none).
func histCount(t *testing.T, fams map[string]*dto.MetricFamily, verb, result string) uint64 {
	t.Helper()
	found := (&promcheck.Scrape{Families: fams}).Find("cni_usernet_plugin_operation_duration_seconds", map[string]string{"operation": verb, "result": result})
	if len(found) == 0 {
		return 0
	}
	h := found[0].GetHistogram()
	if h.GetSampleSum() <= 0 {
		t.Errorf("%s %s: duration sum %v, want > 0", verb, result, h.GetSampleSum())
	}
	return h.GetSampleCount()
}

// startAgent runs the node agent on the env, serving its metrics.
func startAgent(t *testing.T, env *nettest.Env, extra ...string) {
	t.Helper()
	env.StartAgent(t, append([]string{"--metrics-address", metricsAddr, "--metrics-interval", "1s"}, extra...)...)
}
