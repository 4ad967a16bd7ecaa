package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// The probe's two namespaces and their addresses: a /30 that exists only
// on the veth pair between them, so no probe traffic leaves the machine.
const (
	nsClient   = "ub-sockmap-probe-a"
	nsServer   = "ub-sockmap-probe-b"
	addrClient = "10.251.77.1"
	addrServer = "10.251.77.2"
)

// makeNamespaces makes the two namespaces and the veth pair between them,
// and returns what removes them (removing a namespace removes its end of
// the pair, and with it the other).
func makeNamespaces() (func(), error) {
	cleanup := func() {
		for _, ns := range []string{nsClient, nsServer} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	cleanup() // a run killed before its cleanup left them
	steps := [][]string{
		{"netns", "add", nsClient},
		{"netns", "add", nsServer},
		{"-n", nsClient, "link", "add", "ubprobe0", "type", "veth", "peer", "name", "ubprobe1", "netns", nsServer},
		{"-n", nsClient, "addr", "add", addrClient + "/30", "dev", "ubprobe0"},
		{"-n", nsServer, "addr", "add", addrServer + "/30", "dev", "ubprobe1"},
		{"-n", nsClient, "link", "set", "ubprobe0", "up"},
		{"-n", nsServer, "link", "set", "ubprobe1", "up"},
		{"-n", nsClient, "link", "set", "lo", "up"},
		{"-n", nsServer, "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if out, err := exec.Command("ip", st...).CombinedOutput(); err != nil {
			cleanup()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(st, " "), err, out)
		}
	}
	return cleanup, nil
}

// inNetns runs f on a thread in the named namespace: a socket made there
// stays in it wherever it is used afterwards.
func inNetns(name string, f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening this thread's namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening namespace %s: %w", name, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering namespace %s: %w", name, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so the runtime retires it with its
		// goroutine instead of reusing it in the wrong namespace.
		return fmt.Errorf("leaving namespace %s: %w", name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// pairAcross connects a socket in the client namespace to one accepted
// in the server namespace, over the veth pair.
func pairAcross() (client, server int, serverPort int, err error) {
	var l int
	srv := &unix.SockaddrInet4{Addr: [4]byte(net.ParseIP(addrServer).To4())}
	if err := inNetns(nsServer, func() error {
		var err error
		l, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	}); err != nil {
		return 0, 0, 0, fmt.Errorf("listening socket: %w", err)
	}
	c, err := listenAndConnect(l, srv, func() (int, error) {
		var c int
		err := inNetns(nsClient, func() error {
			var err error
			c, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			return err
		})
		return c, err
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return c.client, c.server, c.port, nil
}
