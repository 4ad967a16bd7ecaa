// SPDX-License-Identifier: Apache-2.0

package hostile

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// maxMirrored is the relay's documented cap on mirrored listeners
// (pkg/stack/relay/mirror.go).
const maxMirrored = 512

// TestManyListeners has a pod open far more listening sockets than its
// stack mirrors into netstack (each mirror a netstack endpoint and a
// goroutine, paid by the stack): the stack mirrors at most maxMirrored,
// counts the rest (tcpMirrorOverCap), stays healthy, and a connection
// from the node reaches the application on a port it mirrors and on every
// port it samples among the rest (through the forwarder).
func TestManyListeners(t *testing.T) {
	nettest.RequireRoot(t)
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	att := loadState(t, env, pod)
	const first, n = 20000, 3 * maxMirrored
	for p := first; p < first+n; p++ {
		nettest.Serve(nettest.Listen(t, pod.NS, "tcp4", fmt.Sprintf("0.0.0.0:%d", p)), func(c net.Conn) { c.Close() })
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := status(t, att).Relay
		if r.TCPMirrored+r.TCPMirrorOverCap >= n || r.TCPMirrored > maxMirrored {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stack sees %d mirrored and %d not mirrored of the pod's %d listeners after 15 s", r.TCPMirrored, r.TCPMirrorOverCap, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	st := status(t, att)
	t.Logf("mirrored %d, not mirrored %d", st.Relay.TCPMirrored, st.Relay.TCPMirrorOverCap)
	if st.Relay.TCPMirrored > maxMirrored {
		t.Errorf("the stack mirrors %d listeners: want at most %d", st.Relay.TCPMirrored, maxMirrored)
	}
	if want := int64(n - maxMirrored); st.Relay.TCPMirrorOverCap != want {
		t.Errorf("tcpMirrorOverCap is %d: want %d", st.Relay.TCPMirrorOverCap, want)
	}
	if !st.Healthy {
		t.Errorf("the stack reports itself unhealthy: %s", st.Problem)
	}
	// Every port answers, mirrored or not.
	for p := first; p < first+n; p += n / 16 {
		c, err := nettest.Dial(env.Node, "tcp", nettest.HostPort(pod.IP(4), p), 3*time.Second)
		if err != nil {
			t.Errorf("connecting from the node to port %d: %v", p, err)
			continue
		}
		c.Close()
	}
}
