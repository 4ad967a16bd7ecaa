package loadgen

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"
)

// TCP_RR: one connection, one byte each way, as fast as the round trips go.

// RRWarmup round trips open every rr-client run, unmeasured.
const RRWarmup = 1000

// RRResult is what rr-client prints.
type RRResult struct {
	N     int     `json:"n"`
	P50US float64 `json:"p50Us"`
	P99US float64 `json:"p99Us"`
}

// RRServerMain is the rr-server role: the pod's end of TCP_RR.
func RRServerMain(args []string) int {
	fs := flag.NewFlagSet("rr-server", flag.ContinueOnError)
	addr := fs.String("listen", ":7777", "listen address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go func() {
			defer c.Close()
			var b [1]byte
			for {
				if _, err := io.ReadFull(c, b[:]); err != nil {
					return
				}
				if _, err := c.Write(b[:]); err != nil {
					return
				}
			}
		}()
	}
}

// RRClientMain is the rr-client role: the node's end of TCP_RR, printing an RRResult.
func RRClientMain(args []string) int {
	fs := flag.NewFlagSet("rr-client", flag.ContinueOnError)
	addr := fs.String("addr", "", "server address")
	d := fs.Duration("time", 10*time.Second, fmt.Sprintf("measurement duration (after %d warm-up round trips)", RRWarmup))
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c, err := net.DialTimeout("tcp", *addr, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	var b [1]byte
	// A round trip that takes longer than this is a failure, not a sample.
	const stall = 5 * time.Second
	rt := func() (time.Duration, error) {
		start := time.Now()
		if err := c.SetDeadline(start.Add(stall)); err != nil {
			return 0, err
		}
		if _, err := c.Write(b[:]); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	for range RRWarmup {
		if _, err := rt(); err != nil {
			fmt.Fprintln(os.Stderr, "warm-up:", err)
			return 1
		}
	}
	var lat []time.Duration
	for end := time.Now().Add(*d); time.Now().Before(end); {
		l, err := rt()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lat = append(lat, l)
	}
	slices.Sort(lat)
	us := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) / 1000 }
	if err := json.NewEncoder(os.Stdout).Encode(RRResult{N: len(lat), P50US: us(0.50), P99US: us(0.99)}); err != nil {
		return 1
	}
	return 0
}
