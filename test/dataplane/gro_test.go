package dataplane

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestSoftwareModeAggregatesOnTheNode: in software mode ADD turns GRO on
// on the node's end of the pod's link, and the node receives a pod's bulk
// stream as aggregates, not as the MTU-sized segments the pod link's GSO
// cut; byte-exact. In hardware mode the node's end is left as it was.
func TestSoftwareModeAggregatesOnTheNode(t *testing.T) {
	for _, c := range []struct {
		mode string
		gro  bool
	}{{"software", true}, {"hardware", false}} {
		t.Run(c.mode, func(t *testing.T) {
			env, pod := newPod(t, map[string]any{"gso": c.mode})
			hv := pod.HostVeth()
			// stats reads whether GRO is on on the node's end and the
			// segments the node's TCP took in: an aggregate counts once.
			stats := func() (gro bool, inSegs uint64) {
				t.Helper()
				err := env.Node.Do(func(ns.NetNS) error {
					out, err := exec.Command("ethtool", "-k", hv).Output()
					if err != nil {
						return fmt.Errorf("ethtool -k %s: %v", hv, err)
					}
					gro = strings.Contains(string(out), "generic-receive-offload: on")
					// The thread's own view: it is the one in the node's
					// namespace.
					snmp, err := os.ReadFile("/proc/thread-self/net/snmp")
					if err != nil {
						return err
					}
					inSegs, err = tcpInSegs(string(snmp))
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				return gro, inSegs
			}
			gro, s0 := stats()
			if gro != c.gro {
				t.Fatalf("GRO on the node's end %s: %v, want %v", hv, gro, c.gro)
			}
			if !c.gro {
				return
			}
			const size = 64 << 20
			got := make(chan int64, 1)
			nettest.Serve(nettest.Listen(t, env.Node, "tcp", ":7100"), func(conn net.Conn) {
				n, _ := io.Copy(io.Discard, conn)
				got <- n
			})
			conn, err := nettest.Dial(pod.NS, "tcp", nettest.HostPort(pod.Gateway(4), 7100), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			for range size / len(buf) {
				if _, err := conn.Write(buf); err != nil {
					t.Fatal(err)
				}
			}
			conn.Close()
			select {
			case n := <-got:
				if n != size {
					t.Fatalf("the node received %d bytes of %d", n, size)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the node's server did not finish")
			}
			_, s1 := stats()
			avg := float64(size) / float64(s1-s0)
			t.Logf("the node's TCP took %d bytes in %d segments, %.0f bytes each", size, s1-s0, avg)
			// Without GRO every segment is one of the pod's MTU.
			if avg < 3*1500 {
				t.Errorf("the node's TCP received %.0f bytes per segment: the MTU's segments, not aggregates", avg)
			}
		})
	}
}

// tcpInSegs reads Tcp's InSegs from /proc/net/snmp.
func tcpInSegs(snmp string) (uint64, error) {
	var names []string
	for _, line := range strings.Split(snmp, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "InSegs" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no Tcp InSegs in /proc/net/snmp")
}
