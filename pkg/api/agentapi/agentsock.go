// Package agentapi is how the plugin reaches the node agent, the two ways
// a short-lived process can: the agent's unix socket, <run dir>/agent.sock,
// which ADD asks for a new pod's network policy and waits on until the
// pod's stack holds it (docs/policy.md), and the operation log (oplog.go),
// to which every verb appends its result for the agent's metrics.
package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"time"
)

// Name is the socket's file name in the run directory.
const Name = "agent.sock"

// Path is the agent's socket in runDir.
func Path(runDir string) string { return filepath.Join(runDir, Name) }

// PolicyPath is the request's path.
const PolicyPath = "/v1/policy"

// PolicyRequest asks the agent to compile a pod's policy, write it to
// PolicyPath and push it to the stack at ControlSocket.
type PolicyRequest struct {
	ContainerID   string   `json:"containerID"`
	IfName        string   `json:"ifName"`
	Namespace     string   `json:"namespace"`
	Pod           string   `json:"pod"`
	PodIPs        []string `json:"podIPs"`
	ControlSocket string   `json:"controlSocket"`
	PolicyPath    string   `json:"policyPath"`
}

// Validate reports the first field missing.
func (r *PolicyRequest) Validate() error {
	switch {
	case r.ContainerID == "" || r.IfName == "":
		return errors.New("no container ID or interface")
	case r.Namespace == "" || r.Pod == "":
		return errors.New("no pod namespace or name")
	case len(r.PodIPs) == 0:
		return errors.New("no pod addresses")
	case r.ControlSocket == "" || r.PolicyPath == "":
		return errors.New("no control socket or policy file")
	}
	return nil
}

// PolicyAnswer is the agent's answer to a request it served.
type PolicyAnswer struct {
	// Generation is the policy generation the pod's stack now holds.
	Generation uint64 `json:"generation"`
}

// ErrUnavailable marks an agent that is not there, or not ready to answer
// (503: its caches have not synced): the caller should try again later.
var ErrUnavailable = errors.New("node agent unavailable")

// RequestPolicy sends r to the agent at socket and waits up to timeout
// for the pod's stack to hold its policy.
func RequestPolicy(ctx context.Context, socket string, timeout time.Duration, r PolicyRequest) (uint64, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent"+PolicyPath, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, fmt.Errorf("asking the node agent at %s for the pod's network policy: %w: %w", socket, ErrUnavailable, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		msg := bytes.TrimSpace(b)
		if resp.StatusCode == http.StatusServiceUnavailable {
			return 0, fmt.Errorf("the node agent cannot apply the pod's network policy yet: %w: %s", ErrUnavailable, msg)
		}
		return 0, fmt.Errorf("the node agent did not apply the pod's network policy: %s: %s", resp.Status, msg)
	}
	var a PolicyAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return 0, fmt.Errorf("decoding the node agent's answer %q: %w", b, err)
	}
	return a.Generation, nil
}
