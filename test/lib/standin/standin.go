// Package standin stands in for the node agent in root tests of stacks
// that enforce policy: ADD asks the agent's socket for a new pod's policy
// when networkPolicy is on, and the tests push the policies themselves.
package standin

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// Agent serves the node agent's socket (<runDir>/agent.sock,
// docs/policy.md) of env until the test ends: it answers a policy request
// once the stack is up, with the generation the stack holds, so that every
// policy a test checks is one it pushed.
func Agent(t testing.TB, env *nettest.Env) {
	t.Helper()
	dir := filepath.Join(env.Dir, "run")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var q struct {
			ControlSocket string `json:"controlSocket"`
		}
		if err := json.NewDecoder(req.Body).Decode(&q); err != nil || req.Method != http.MethodPost {
			http.Error(w, fmt.Sprint("not a policy request: ", err), http.StatusBadRequest)
			return
		}
		var st control.Status
		if err := control.FetchStatus(q.ControlSocket, 5*time.Second, &st); err != nil || st.Policy == nil {
			http.Error(w, fmt.Sprintf("stack without a policy: %v", err), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"generation": %d}`, st.Policy.Generation)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}
