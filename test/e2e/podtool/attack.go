package main

// podtool attack: the hostile pod of test/lib/attack, run inside a real pod by
// test/e2e (wire_test.go) through kubectl exec.
//
//	podtool attack run SPEC
//	                 run the attacks of SPEC (an attack.Spec, JSON) in this pod;
//	                 one outcome a line (JSON), as they come
//	podtool attack record BASE PORT...
//	                 serve UDP and TCP on each PORT (udp:7070, tcp:7071) and note
//	                 every marker beginning with BASE that arrives, until
//	                 standard input ends (or ten minutes); print "listening"
//	                 once serving, then the markers, one JSON object
//	podtool attack send MARKER COUNT TARGET...
//	                 send COUNT datagrams carrying MARKER to each TARGET
//	                 (udp:ADDR:PORT), 200 ms apart

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/attack"
)

func attackMain(args []string) int {
	usage := func() int {
		fmt.Fprintln(os.Stderr, "usage: podtool attack run SPEC | record BASE PORT... | send MARKER COUNT TARGET...")
		return 2
	}
	if len(args) == 0 {
		return usage()
	}
	switch args[0] {
	case "run":
		if len(args) != 2 {
			return usage()
		}
		var s attack.Spec
		if err := json.Unmarshal([]byte(args[1]), &s); err != nil {
			fmt.Fprintln(os.Stderr, "attack run: reading the spec:", err)
			return 2
		}
		if err := attack.Run(s, func(o attack.Outcome) { os.Stdout.Write(attack.Encode(o)) }); err != nil {
			fmt.Fprintln(os.Stderr, "attack run:", err)
			return 2
		}
		return 0
	case "record":
		if len(args) < 3 {
			return usage()
		}
		return record(args[1], args[2:])
	case "send":
		if len(args) < 4 {
			return usage()
		}
		n, err := strconv.Atoi(args[2])
		if err != nil || n <= 0 {
			return usage()
		}
		return send(args[1], n, args[3:])
	}
	return usage()
}

// record serves the ports until standard input ends, then prints what it
// saw.
func record(base string, ports []string) int {
	rec := attack.NewRecorder(base)
	defer rec.Close()
	for _, p := range ports {
		proto, port, ok := strings.Cut(p, ":")
		addr := net.JoinHostPort("::", port)
		var err error
		switch {
		case ok && proto == "udp":
			err = rec.ListenUDP(addr)
		case ok && proto == "tcp":
			err = rec.ListenTCP(addr)
		default:
			err = fmt.Errorf("port %q: want udp:PORT or tcp:PORT", p)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "attack record:", err)
			return 2
		}
	}
	fmt.Println("listening")
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
	}
	b, _ := json.Marshal(rec.Seen())
	fmt.Println(string(b))
	return 0
}

// send sends the datagrams; a target it cannot send to is reported and
// skipped.
func send(marker string, n int, targets []string) int {
	rc := 0
	var conns []net.Conn
	for _, tg := range targets {
		proto, addr, _ := strings.Cut(tg, ":")
		if proto != "udp" {
			fmt.Fprintf(os.Stderr, "attack send: target %q: want udp:ADDR:PORT\n", tg)
			return 2
		}
		c, err := net.Dial("udp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "attack send:", err)
			rc = 1
			continue
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i := range n {
		if i > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		for _, c := range conns {
			c.Write([]byte(marker))
		}
	}
	return rc
}
