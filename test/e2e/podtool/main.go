// Command podtool is the e2e test's pod server: one static binary in the test
// image beside busybox (whose nc has no UDP and which has no DNS server).
//
//	podtool serve    HTTP on :8080, UDP echo on :9090, DNS on :53/udp, TCP echo on :9000,
//	                 TCP sink on :9001, TCP source on :9002
//	podtool probe TIMEOUT TARGET...
//	                 probe every TARGET at once (tcp:ADDR:PORT a connection and
//	                 podtool's HTTP answer, udp:ADDR:PORT podtool's UDP echo,
//	                 dns:NAME a lookup through the pod's resolver), each within
//	                 TIMEOUT; one line per target: "TARGET ok" or "TARGET fail"
//
// The sink and the source measure a pod's shaped bandwidth: the sink reads
// until the peer's FIN and answers with the bytes it received in each
// second (a JSON list), counted from the first byte; the source reads a
// number of seconds on one line and sends as fast as it can for that long.
//
// Every answer names the pod (POD_NAME) and the peer address it saw, so the
// test can tell which pod answered and that the relay kept the client's
// address.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DNSAnswer is the IPv4 address every A query is answered with (TEST-NET-2:
// data only, nothing connects to it).
var DNSAnswer = net.IPv4(198, 51, 100, 53).To4()

func main() {
	if len(os.Args) >= 2 && os.Args[1] == "attack" {
		os.Exit(attackMain(os.Args[2:]))
	}
	if len(os.Args) >= 3 && os.Args[1] == "probe" {
		d, err := time.ParseDuration(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "probe: timeout:", err)
			os.Exit(2)
		}
		probeAll(d, os.Args[3:])
		return
	}
	if len(os.Args) != 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: podtool serve | podtool probe TIMEOUT TARGET...")
		os.Exit(2)
	}
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	errc := make(chan error, 6)
	go func() { errc <- serveHTTP(name) }()
	go func() { errc <- serveUDPEcho(name) }()
	go func() { errc <- serveDNS() }()
	go func() { errc <- serveTCPEcho() }()
	go func() { errc <- serveTCP(":9001", sink) }()
	go func() { errc <- serveTCP(":9002", source) }()
	log.Printf("podtool %s serving", name)
	log.Fatal(<-errc)
}

func serveHTTP(name string) error {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "pod=%s client=%s\n", name, r.RemoteAddr)
	})
	return fmt.Errorf("http: %w", http.ListenAndServe(":8080", h))
}

func serveUDPEcho(name string) error {
	c, err := net.ListenPacket("udp", ":9090")
	if err != nil {
		return fmt.Errorf("udp echo: %w", err)
	}
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("udp echo: %w", err)
		}
		reply := fmt.Sprintf("pod=%s client=%s data=%s", name, from, buf[:n])
		if _, err := c.WriteTo([]byte(reply), from); err != nil {
			log.Printf("udp echo reply to %s: %v", from, err)
		}
	}
}

func serveTCPEcho() error {
	l, err := net.Listen("tcp", ":9000")
	if err != nil {
		return fmt.Errorf("tcp echo: %w", err)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return fmt.Errorf("tcp echo: %w", err)
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

func serveTCP(addr string, handle func(net.Conn)) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tcp %s: %w", addr, err)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return fmt.Errorf("tcp %s: %w", addr, err)
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// sink counts what it receives per second until the peer's FIN and
// answers with the counts.
func sink(c net.Conn) {
	var perSecond []int64
	var start time.Time
	buf := make([]byte, 256<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			now := time.Now()
			if start.IsZero() {
				start = now
			}
			i := int(now.Sub(start) / time.Second)
			for len(perSecond) <= i {
				perSecond = append(perSecond, 0)
			}
			perSecond[i] += int64(n)
		}
		if err != nil {
			break
		}
	}
	json.NewEncoder(c).Encode(perSecond)
}

// source sends for the number of seconds the peer asks for.
func source(c net.Conn) {
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	secs, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || secs <= 0 || secs > 300 {
		fmt.Fprintf(c, "bad duration %q\n", line)
		return
	}
	buf := make([]byte, 64<<10)
	end := time.Now().Add(time.Duration(secs) * time.Second)
	for time.Now().Before(end) {
		c.SetWriteDeadline(end)
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// serveDNS answers every A query with DNSAnswer and every other query with
// no records: enough for busybox nslookup, and DNS-shaped traffic (a query
// from an ephemeral port to port 53, an answer back) through a Service.
func serveDNS() error {
	c, err := net.ListenPacket("udp", ":53")
	if err != nil {
		return fmt.Errorf("dns: %w", err)
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("dns: %w", err)
		}
		reply, err := dnsReply(buf[:n])
		if err != nil {
			log.Printf("dns query from %s: %v", from, err)
			continue
		}
		if _, err := c.WriteTo(reply, from); err != nil {
			log.Printf("dns reply to %s: %v", from, err)
		}
	}
}

func dnsReply(q []byte) ([]byte, error) {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil, errors.New("not a query with one question")
	}
	// The question: labels up to the zero byte, then type and class.
	i := 12
	for i < len(q) && q[i] != 0 {
		if q[i]&0xc0 != 0 {
			return nil, errors.New("compressed name in a question")
		}
		i += int(q[i]) + 1
	}
	if i+5 > len(q) {
		return nil, errors.New("truncated question")
	}
	qend := i + 5
	qtype := binary.BigEndian.Uint16(q[i+1 : i+3])
	r := make([]byte, 0, qend+16)
	r = append(r, q[0:2]...)         // ID
	r = append(r, 0x80|q[2]&1, 0x80) // response, recursion desired (as asked) and available
	r = binary.BigEndian.AppendUint16(r, 1)
	ancount := uint16(0)
	if qtype == 1 {
		ancount = 1
	}
	r = binary.BigEndian.AppendUint16(r, ancount)
	r = append(r, 0, 0, 0, 0) // NSCOUNT, ARCOUNT
	r = append(r, q[12:qend]...)
	if ancount == 1 {
		r = append(r, 0xc0, 12)                     // name: pointer to the question's
		r = append(r, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4) // A, IN, TTL 5, 4 bytes
		r = append(r, DNSAnswer...)
	}
	return r, nil
}

// probeAll probes the targets in parallel and prints one line for each, in
// the order given.
func probeAll(timeout time.Duration, targets []string) {
	res := make([]bool, len(targets))
	var wg sync.WaitGroup
	for i, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = probe(timeout, tg) == nil
		}()
	}
	wg.Wait()
	for i, tg := range targets {
		r := "fail"
		if res[i] {
			r = "ok"
		}
		fmt.Println(tg, r)
	}
}

func probe(timeout time.Duration, target string) error {
	kind, addr, _ := strings.Cut(target, ":")
	deadline := time.Now().Add(timeout)
	switch kind {
	case "tcp":
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "HTTP/1.0 200") {
			return fmt.Errorf("answer %q", line)
		}
		return nil
	case "udp":
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		buf := make([]byte, 2048)
		// A datagram may be lost while neighbours resolve: send again
		// within the timeout.
		for time.Now().Before(deadline) {
			c.Write([]byte("probe"))
			next := time.Now().Add(timeout / 4)
			if next.After(deadline) {
				next = deadline
			}
			c.SetReadDeadline(next)
			n, err := c.Read(buf)
			if err == nil && strings.HasPrefix(string(buf[:n]), "pod=") {
				return nil
			}
		}
		return errors.New("no answer")
	case "dns":
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		_, err := net.DefaultResolver.LookupHost(ctx, addr)
		return err
	}
	return fmt.Errorf("unknown probe %q", kind)
}
