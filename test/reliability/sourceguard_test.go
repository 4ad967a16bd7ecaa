// SPDX-License-Identifier: Apache-2.0

package reliability

import (
	"encoding/binary"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestSourceGuardRestored: `nft flush ruleset` on the node takes every
// pod's source guard away; the agent puts it back at once (nftables
// reports the deletion), and frames from a source that is not the pod's
// are dropped again.
func TestSourceGuardRestored(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	store := state.Store{Dir: filepath.Join(env.Dir, "state")}
	att, err := store.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if att.SourceGuard == "" {
		t.Fatal("ADD recorded no source guard")
	}
	wire := env.WireNS(pod)
	// The reconcile timer stays out of the test's minute: only the
	// reaction to nftables' deletion can restore the guard in time.
	agent := startAgent(t, env, "--reconcile-interval", "10m")

	holds := func() bool {
		t.Helper()
		var ok bool
		if err := nettest.In(env.Node, func() (err error) {
			ok, err = sourceguard.Holds(att.SourceGuard)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	dropped := func() uint64 {
		t.Helper()
		var n uint64
		nettest.In(env.Node, func() (err error) {
			n, err = sourceguard.Dropped(att.SourceGuard)
			return err
		})
		return n
	}
	// spoof sends frames from another MAC and address from the pod's
	// end of the link, where a subverted stack would.
	spoof := func(n int) {
		t.Helper()
		if err := nettest.In(wire, func() error { return sendSpoofed(att.IfName, n) }); err != nil {
			t.Fatalf("sending spoofed frames: %v", err)
		}
	}

	if !holds() {
		t.Fatal("no source guard after ADD")
	}
	before := dropped()
	spoof(3)
	if got := dropped(); got < before+3 {
		t.Fatalf("spoofed frames dropped by the guard after ADD: got %d, want ≥ %d", got, before+3)
	}

	flush := exec.Command("nft", "flush", "ruleset")
	if err := nettest.In(env.Node, func() error {
		out, err := flush.CombinedOutput()
		if err != nil {
			t.Logf("nft: %s", out)
		}
		return err
	}); err != nil {
		t.Fatalf("nft flush ruleset in the node namespace: %v", err)
	}
	flushed := time.Now()
	for !holds() {
		if time.Since(flushed) > 5*time.Second {
			t.Fatalf("source guard on %s not restored 5 s after nft flush ruleset", att.SourceGuard)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("source guard restored %s after the flush", time.Since(flushed).Round(time.Millisecond))
	before = dropped()
	spoof(3)
	if got := dropped(); got < before+3 {
		t.Errorf("spoofed frames dropped by the restored guard: got %d, want ≥ %d", got, before+3)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(agent.Output(), "restored the pod's source guard"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("agent log: no line for the restored guard")
			break
		}
	}
}

// sendSpoofed writes n IPv4 frames on link from a MAC and an address
// that are not the pod's, with a packet socket in the calling thread's
// namespace.
func sendSpoofed(link string, n int) error {
	ifc, err := net.InterfaceByName(link)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	frame := make([]byte, 14+20)
	copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:12], []byte{0x02, 0xde, 0xad, 0xbe, 0xef, 0x01})
	binary.BigEndian.PutUint16(frame[12:], unix.ETH_P_IP)
	ip := frame[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], 20)
	copy(ip[12:16], []byte{10, 199, 0, 250}) // in the env's pod subnet, not the pod's
	copy(ip[16:20], []byte{10, 199, 0, 1})
	to := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Protocol: htons(unix.ETH_P_IP)}
	for range n {
		if err := unix.Sendto(fd, frame, 0, to); err != nil {
			return err
		}
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
