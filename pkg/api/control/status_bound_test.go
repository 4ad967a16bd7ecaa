// SPDX-License-Identifier: Apache-2.0

package control_test

import (
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
)

// A stack that answers /status with a body that never ends (a subverted
// stack, or a bug) costs its reader MaxStatusBytes, not its memory for as
// long as the timeout lets the body flow.
func TestFetchStatusBoundsTheBody(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stack.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in streams one JSON string that never closes. It stops at
	// 64 MiB and then holds the connection, so that a reader without a
	// bound buffers that much and then waits for its timeout, rather
	// than filling the machine's memory.
	chunk := []byte(strings.Repeat("a", 64<<10))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"protocol":2,"build":"`))
		for range 1024 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		<-r.Context().Done()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	const timeout = 20 * time.Second
	start := time.Now()
	var st control.Status
	err = control.FetchStatus(sock, timeout, &st)
	took := time.Since(start)
	if !errors.Is(err, control.ErrStatusTooLarge) {
		t.Fatalf("status of an endless body: got %v after %s, want %v", err, took.Round(time.Millisecond), control.ErrStatusTooLarge)
	}
	if took > timeout/2 {
		t.Errorf("status of an endless body: took %s, want the bound long before the %s timeout", took.Round(time.Millisecond), timeout)
	}
}
