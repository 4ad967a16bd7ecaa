package policyctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// podWait is how long a request waits for the pod to reach the agent's
// cache: the pod object exists before its sandbox, but the watch may
// deliver it a little after the runtime calls ADD.
const podWait = 5 * time.Second

// ServeSocket serves the agent's socket (docs/policy.md) at path until ctx
// ends: the plugin's ADD asks there for a new pod's policy, which c
// compiles and pushes before it answers.
func ServeSocket(ctx context.Context, path string, c *Controller) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the stale agent socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	// Root only: it makes the agent write files and push to stacks.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("restricting %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+agentapi.PolicyPath, c.servePolicy)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	go func() {
		<-ctx.Done()
		srv.Close()
		os.Remove(path)
	}()
	return nil
}

func (c *Controller) servePolicy(w http.ResponseWriter, r *http.Request) {
	var req agentapi.PolicyRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err == nil {
		err = req.Validate()
	}
	t := target{
		key: state.Key(req.ContainerID, req.IfName), namespace: req.Namespace, pod: req.Pod,
		socket: req.ControlSocket, file: req.PolicyPath,
	}
	for _, s := range req.PodIPs {
		if err != nil {
			break
		}
		var a netip.Addr
		if strings.Contains(s, "/") {
			var p netip.Prefix
			p, err = netip.ParsePrefix(s)
			a = p.Addr()
		} else {
			a, err = netip.ParseAddr(s)
		}
		t.ips = append(t.ips, a)
	}
	if err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	gen, err := c.applyNow(r.Context(), t, podWait)
	if err != nil {
		c.o.Log.Warn("the pod's policy could not be applied for its ADD", "pod", req.Namespace+"/"+req.Pod, "container", req.ContainerID, "err", err)
		// Every failure here is one to try again later: caches not
		// synced, the pod not delivered yet, the stack not answering.
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(agentapi.PolicyAnswer{Generation: gen})
}
