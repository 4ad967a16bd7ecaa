package enforce_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
)

// source is a stack's control source with an Enforcer (nil: policy off):
// the policy endpoint the stack serves, from the control socket's client
// to the Enforcer.
type source struct{ e *enforce.Enforcer }

func (s *source) Healthy() error { return nil }
func (s *source) Status() any {
	if s.e == nil {
		return map[string]any{}
	}
	return map[string]any{"policy": s.e.Status()}
}

func (s *source) SetPolicy(p *policy.PodPolicy) (uint64, error) {
	if s.e == nil {
		return 0, policy.ErrOff
	}
	if err := s.e.Set(p); err != nil {
		return 0, err
	}
	return p.Generation, nil
}

func listen(t *testing.T, src control.Source) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctl.sock")
	srv, err := control.Listen(path, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return path
}

func gen(n uint64) *policy.PodPolicy {
	p := policy.Closed([]netip.Addr{netip.MustParseAddr("10.0.0.1")})
	p.Generation = n
	return p
}

func refusal(t *testing.T, err error, status int, reason string) {
	t.Helper()
	var re *control.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("got %v, want a refusal with HTTP %d", err, status)
	}
	if re.Status != status || !strings.Contains(re.Reason, reason) {
		t.Fatalf("got HTTP %d %q, want %d with %q", re.Status, re.Reason, status, reason)
	}
}

func TestPutPolicy(t *testing.T) {
	e, err := enforce.NewEnforcer(policy.Closed(nil))
	if err != nil {
		t.Fatal(err)
	}
	path := listen(t, &source{e})
	if g, err := control.PutPolicy(path, time.Second, gen(7)); err != nil || g != 7 {
		t.Fatalf("push of generation 7: got %d, %v", g, err)
	}
	_, err = control.PutPolicy(path, time.Second, gen(6))
	refusal(t, err, http.StatusConflict, "older")
	if g, err := control.PutPolicy(path, time.Second, gen(7)); err != nil || g != 7 {
		t.Fatalf("repeated push of generation 7: got %d, %v", g, err)
	}
	bad := gen(9)
	bad.Version = policy.FormatVersion + 1
	_, err = control.PutPolicy(path, time.Second, bad)
	refusal(t, err, http.StatusBadRequest, "format version")
	bad = gen(9)
	bad.Ingress.Rules = []policy.Rule{{Ports: []policy.PortRange{{Protocol: "ICMP"}}}}
	_, err = control.PutPolicy(path, time.Second, bad)
	refusal(t, err, http.StatusBadRequest, `unknown protocol "ICMP"`)
	// The refused pushes left generation 7 in force.
	if g := e.Current().Generation(); g != 7 {
		t.Fatalf("after refused pushes: generation %d in force, want 7", g)
	}
	var st control.Status
	if err := control.FetchStatus(path, time.Second, &st); err != nil {
		t.Fatal(err)
	}
	if st.Policy == nil || st.Policy.Generation != 7 || !st.Policy.IngressIsolated || !st.Policy.EgressIsolated {
		t.Fatalf("status: got %+v", st.Policy)
	}
}

// mustRequest is a raw PUT of a body that is not JSON.
func mustRequest(t *testing.T, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, "http://stack/policy", strings.NewReader("not json"))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func unixDial(path string) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

func TestPutPolicyNotJSON(t *testing.T) {
	e, _ := enforce.NewEnforcer(policy.Closed(nil))
	path := listen(t, &source{e})
	// PutPolicy always sends JSON; the handler must refuse what is not.
	c := &http.Client{Transport: &http.Transport{DialContext: unixDial(path)}}
	resp, err := c.Do(mustRequest(t, path))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("not JSON: got HTTP %d, want 400", resp.StatusCode)
	}
}

func TestPutPolicyOff(t *testing.T) {
	path := listen(t, &source{})
	_, err := control.PutPolicy(path, time.Second, gen(1))
	refusal(t, err, http.StatusConflict, "policy enforcement is off")
}

// TestPutPolicyWhileChecking swaps policies while verdicts are taken, as
// the wire leg and the relay do (run with -race).
func TestPutPolicyWhileChecking(t *testing.T) {
	e, _ := enforce.NewEnforcer(policy.Closed(nil))
	path := listen(t, &source{e})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			peer := netip.MustParseAddr("10.0.0.9")
			for {
				select {
				case <-stop:
					return
				default:
				}
				if m := e.For(policy.Ingress); m != nil {
					m.Check(policy.Ingress, peer, policy.ProtoTCP, 80)
				}
				_ = e.Status()
			}
		})
	}
	for g := range uint64(50) {
		p := gen(g + 1)
		if g%2 == 1 {
			p.Ingress = policy.Direction{}
		}
		if _, err := control.PutPolicy(path, time.Second, p); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if g := e.Current().Generation(); g != 50 {
		t.Fatalf("generation %d in force, want 50", g)
	}
}
