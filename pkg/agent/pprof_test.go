package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestPprofOnLoopbackOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.DiscardHandler)
	for _, addr := range []string{":6060", "0.0.0.0:6060", "10.0.0.1:6060", "[::]:6060", "node:6060", "6060"} {
		if err := servePprof(ctx, addr, log); err == nil {
			t.Errorf("servePprof(%q) served profiles off loopback", addr)
		}
	}
	// A free loopback port, handed to servePprof.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := servePprof(ctx, addr, log); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "heap profile") {
		t.Fatalf("GET /debug/pprof/heap: %s: %.200s", resp.Status, b)
	}
}
