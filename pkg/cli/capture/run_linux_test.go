package capture

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenWireEarlierRelease: a stack without a capture stream (an earlier
// release's, which answers 404) is named as such, with what to do, not as
// a bare HTTP status.
func TestOpenWireEarlierRelease(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stack.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	_, err = openWire(sock, 256, 0, 2)
	if err == nil {
		t.Fatal("openWire succeeded against a stack without a capture stream")
	}
	for _, want := range []string{sock, "earlier release", "agent starts it again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
