// SPDX-License-Identifier: Apache-2.0

package sockmap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// members reads the cookies of the sockets in the node's socket hashes:
// socks (with the verdict) and targets (without programs). A hash the
// node does not have holds nothing.
func (r *rig) members() (socks, targets map[uint64]bool) {
	r.t.Helper()
	read := func(pin string) map[uint64]bool {
		out := map[uint64]bool{}
		m, err := ebpf.LoadPinnedMap(filepath.Join(PinDir(r.root), pin), nil)
		if errors.Is(err, os.ErrNotExist) {
			return out
		}
		if err != nil {
			r.t.Fatalf("opening the %s hash: %v", pin, err)
		}
		defer m.Close()
		var key [keySize]byte
		var cookie uint64 // a socket hash's value, read from user space
		it := m.Iterate()
		for it.Next(&key, &cookie) {
			out[cookie] = true
		}
		if err := it.Err(); err != nil {
			r.t.Fatalf("reading the %s hash: %v", pin, err)
		}
		return out
	}
	return read(pinSocks), read(pinTargets)
}

// where says which of the node's hashes hold c.
func (r *rig) where(c *net.TCPConn) (inSocks, inTargets bool) {
	r.t.Helper()
	cookie := socketCookie(r.t, c)
	socks, targets := r.members()
	return socks[cookie], targets[cookie]
}

func socketCookie(t *testing.T, c *net.TCPConn) uint64 {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cookie uint64
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cookie, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatalf("reading a socket's cookie: %v", serr)
	}
	return cookie
}

// eventually calls poke, then checks done, every 50ms until done holds
// or timeout passes.
func eventually(timeout time.Duration, poke func(), done func() bool) bool {
	for end := time.Now().Add(timeout); ; {
		poke()
		if done() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exchange sends a few bytes from w to r and reads them: an ACK of what w
// sent, and so an RTT callback on w.
func exchange(t *testing.T, w, r net.Conn) {
	t.Helper()
	msg := []byte("tick")
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("exchange: got %q, %v; want %q", got, err, msg)
	}
	r.SetReadDeadline(time.Time{})
}

// TestStackSocketsKeepTCPSend: in the default mode the stack's sockets
// are redirect targets only, in the hash without programs, so their
// sends keep TCP's own sendmsg; the applications' sockets are in the
// verdict's hash. With both, the stack's sockets are in both hashes.
func TestStackSocketsKeepTCPSend(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 100, 64)
	if inSocks, inTargets := r.where(server); inSocks || !inTargets {
		t.Errorf("the stack's socket: in socks %v, in targets %v; want in targets only", inSocks, inTargets)
	}
	if inSocks, inTargets := r.where(client); !inSocks || inTargets {
		t.Errorf("the application's socket: in socks %v, in targets %v; want in socks only", inSocks, inTargets)
	}
	// Its sends go through no verdict: not even the pod's later word that
	// its applications never splice redirects them.
	if err := r.node.Enable(r.cookie, true); err != nil {
		t.Fatal(err)
	}
	before := r.stats().Redirected
	pingPong(t, client, server, 100, 64)
	if got := r.stats().Redirected - before; got != 100 {
		t.Errorf("%d messages redirected, want the application's 100 and none of the stack's", got)
	}

	otherNS, other := newPodNS(t)
	if err := r.node.Enable(other, true); err != nil {
		t.Fatal(err)
	}
	o := &rig{t: t, root: r.root, node: r.node, netns: otherNS, cookie: other}
	c2, s2 := o.pair("tcp4", "127.0.0.1:0")
	pingPong(t, c2, s2, 100, 64)
	if inSocks, inTargets := o.where(s2); !inSocks || !inTargets {
		t.Errorf("both: the stack's socket: in socks %v, in targets %v; want in both", inSocks, inTargets)
	}
	if s := o.stats(); s.Redirected != 200 || s.Sockets != 2 {
		t.Errorf("both: stats %+v, want 200 messages redirected and 2 sockets", s)
	}
}

// TestFallbackLeavesHashes: an application's socket that went back to
// TCP (a writer past Budget to a stack that does not read) leaves the
// hashes at the next ACK of what it sends, and the stack's socket
// leaves too once it has read what was redirected to it and leaveGrace
// has passed; the numbered stream arrives whole and in order across
// both changes, and the counters follow.
func TestFallbackLeavesHashes(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	server.SetReadBuffer(256 << 10)
	client.SetWriteBuffer(256 << 10)
	stop := make(chan struct{})
	sent := make(chan int64, 1)
	go func() {
		n, _ := stream(client, stop)
		client.CloseWrite()
		sent <- n
	}()
	time.Sleep(time.Second) // the stack does not read: the writer goes through TCP
	if !eventually(2*time.Second, func() {}, func() bool { s, _ := r.where(client); return !s }) {
		close(stop)
		t.Fatalf("stats %+v: the application's socket is still in socks after it went through TCP", r.stats())
	}
	if s := r.stats(); s.Fallbacks == 0 || s.Sockets != 1 {
		t.Errorf("stats %+v: want the writer's fallback, and the stack's socket alone in the hashes", s)
	}
	// The stack's socket still holds what was redirected to it: it stays.
	if _, inTargets := r.where(server); !inTargets {
		t.Error("the stack's socket left targets with redirected data unread")
	}
	got := make(chan int64, 1)
	go func() { got <- readAll(t, server) }()
	time.Sleep(300 * time.Millisecond) // the writer goes on, through TCP's own path
	close(stop)
	n := <-sent
	select {
	case g := <-got:
		if g != n {
			t.Fatalf("read %d bytes, want the %d sent", g, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("read nothing more after 10s; %d bytes were sent", n) // readAll failed
	}
	if !eventually(3*leaveGrace*time.Nanosecond, func() { exchange(t, server, client) }, func() bool {
		_, inTargets := r.where(server)
		return !inTargets
	}) {
		t.Fatalf("stats %+v: the stack's socket is still in targets with its queue read and its peer on TCP", r.stats())
	}
	if s := r.stats(); s.Sockets != 0 {
		t.Errorf("stats %+v: want no sockets in the hashes", s)
	}
	// The stack's end keeps working on TCP, and closing both leaves the
	// count at zero: a socket that left is not counted out twice.
	exchange(t, server, client)
	client.Close()
	server.Close()
	time.Sleep(100 * time.Millisecond)
	if s := r.stats(); s.Sockets != 0 {
		t.Errorf("stats %+v after the close: want 0 sockets", s)
	}
}

// TestBothFallbackLeavesHashes: with both, a connection leaves the hashes
// only once neither end's verdict can redirect any more (a capture sends
// both through TCP), and each after leaveGrace; every message of the
// ping-pong comes back as sent throughout.
func TestBothFallbackLeavesHashes(t *testing.T) {
	r := newRigBoth(t, true, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 200, 64)
	// The stack writes past Budget to an application that does not read:
	// the stack's socket goes through TCP, but the application's verdict
	// still redirects to it, so neither may leave.
	stop := make(chan struct{})
	sent := make(chan int64, 1)
	go func() {
		n, _ := stream(server, stop)
		sent <- n
	}()
	time.Sleep(time.Second)
	close(stop)
	n := <-sent
	server.SetWriteDeadline(time.Time{})
	buf := make([]byte, n)
	if _, err := io.ReadFull(client, buf); err != nil {
		t.Fatalf("reading the %d bytes the stack sent: %v", n, err)
	}
	for i := int64(0); i+8 <= n; i += 8 {
		if w := binary.LittleEndian.Uint64(buf[i:]); w != uint64(i) {
			t.Fatalf("at offset %d: got word %d: out of order", i, w)
		}
	}
	if s := r.stats(); s.Fallbacks == 0 {
		t.Fatalf("stats %+v: the stack's writer never went through TCP", s)
	}
	exchange(t, server, client)
	exchange(t, client, server)
	time.Sleep(leaveGrace * time.Nanosecond * 3 / 2)
	exchange(t, server, client)
	exchange(t, client, server)
	if s := r.stats(); s.Sockets != 2 {
		t.Fatalf("stats %+v: want both sockets still in the hashes while the application's verdict redirects", s)
	}
	if err := r.node.SetCapture(r.cookie, true); err != nil {
		t.Fatal(err)
	}
	// Not before leaveGrace: a redirect either verdict chose just before
	// its capture may still be on its way.
	for range 5 {
		pingPong(t, client, server, 10, 64)
		time.Sleep(leaveGrace * time.Nanosecond / 20)
	}
	if s := r.stats(); s.Sockets != 2 {
		t.Fatalf("stats %+v: a socket left the hashes before leaveGrace", s)
	}
	left := func() bool {
		cs, ct := r.where(client)
		ss, st := r.where(server)
		return !cs && !ct && !ss && !st
	}
	if !eventually(3*leaveGrace*time.Nanosecond, func() { pingPong(t, client, server, 10, 64) }, left) {
		cs, ct := r.where(client)
		ss, st := r.where(server)
		t.Fatalf("stats %+v: application in socks %v targets %v, stack in socks %v targets %v; want both out", r.stats(), cs, ct, ss, st)
	}
	if s := r.stats(); s.Sockets != 0 {
		t.Errorf("stats %+v: want no sockets in the hashes", s)
	}
	pingPong(t, client, server, 100, 64)
}

// TestHalfCloseAcrossLeaving: redirected data, then TCP data from a socket
// that left the hashes, then its FIN: the stack reads all of it in order
// and then EOF, and its answer and FIN still reach the application.
func TestHalfCloseAcrossLeaving(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	first := bytes.Repeat([]byte("redirected "), 1000)
	if _, err := client.Write(first); err != nil {
		t.Fatal(err)
	}
	if err := r.node.SetCapture(r.cookie, true); err != nil {
		t.Fatal(err)
	}
	second := bytes.Repeat([]byte("through TCP "), 1000)
	if !eventually(2*time.Second, func() {
		if _, err := client.Write(second); err != nil {
			t.Fatal(err)
		}
	}, func() bool { s, _ := r.where(client); return !s }) {
		t.Fatal("the application's socket is still in socks after it went through TCP")
	}
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(server)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, first) {
		t.Fatalf("the stack read %d bytes not starting with the %d redirected", len(got), len(first))
	}
	rest := got[len(first):]
	if len(rest)%12 != 0 || !bytes.Equal(rest, bytes.Repeat([]byte("through TCP "), len(rest)/12)) || len(rest) == 0 {
		t.Fatalf("after the redirected bytes, the stack read %d bytes, not whole messages sent through TCP", len(rest))
	}
	answerAndClose(t, client, server)
}

// TestResetAcrossLeaving: a stack that resets the connection while its
// writer is going through TCP (past Budget) reports the reset to the
// writer, and once both ends closed the pod's count is back to zero.
func TestResetAcrossLeaving(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	server.SetReadBuffer(256 << 10)
	client.SetWriteBuffer(256 << 10)
	done := make(chan error, 1)
	go func() {
		_, err := stream(client, nil)
		done <- err
	}()
	time.Sleep(time.Second)
	if !eventually(2*time.Second, func() {}, func() bool { s, _ := r.where(client); return !s }) {
		t.Error("the application's socket is still in socks after it went through TCP")
	}
	server.SetLinger(0)
	server.Close()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("the writer after the reset: got %v, want ECONNRESET or EPIPE", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not see the reset")
	}
	client.Close()
	time.Sleep(100 * time.Millisecond)
	if s := r.stats(); s.Sockets != 0 {
		t.Errorf("stats %+v after both closed: want 0 sockets", s)
	}
}

// TestUnreadKeepsStackSocket: a stack's socket that holds redirected
// bytes unread stays in targets, whatever its writer does (leaving would
// purge them), however long it goes on sending; once it reads them, it
// got every byte.
func TestUnreadKeepsStackSocket(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	msg := bytes.Repeat([]byte("unread "), 10000)
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := r.node.SetCapture(r.cookie, true); err != nil {
		t.Fatal(err)
	}
	tail := []byte("then through TCP")
	if !eventually(2*time.Second, func() {
		if _, err := client.Write(tail); err != nil {
			t.Fatal(err)
		}
		msg = append(msg, tail...)
	}, func() bool { s, _ := r.where(client); return !s }) {
		t.Fatal("the application's socket is still in socks after it went through TCP")
	}
	// The stack sends (and so is told of each ACK) for longer than
	// leaveGrace without reading.
	for end := time.Now().Add(leaveGrace * time.Nanosecond * 3 / 2); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		exchange(t, server, client)
	}
	if _, inTargets := r.where(server); !inTargets {
		t.Error("the stack's socket left targets with redirected bytes unread")
	}
	client.CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the stack read %d bytes, %v; want the %d sent, in order", len(got), err, len(msg))
	}
	if !eventually(3*leaveGrace*time.Nanosecond, func() { exchange(t, server, client) }, func() bool {
		_, inTargets := r.where(server)
		return !inTargets
	}) {
		t.Fatal("the stack's socket is still in targets with its queue read and its peer on TCP")
	}
}
