package status

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// TestPolicyColumn: off without policy; otherwise the generation and each
// isolated direction with its denials summed over the policies.
func TestPolicyColumn(t *testing.T) {
	for _, tc := range []struct {
		p    *policy.Status
		want string
	}{
		{nil, "off"},
		{&policy.Status{Generation: 3}, "gen 3 open"},
		{&policy.Status{Generation: 7, IngressIsolated: true, EgressIsolated: true,
			Denied: policy.Denied{Ingress: map[string]uint64{"a": 5, "b": 7}}}, "gen 7 in(12) out(0)"},
		{&policy.Status{Generation: 1, EgressIsolated: true, Denied: policy.Denied{Egress: map[string]uint64{"a": 2}}}, "gen 1 out(2)"},
		{&policy.Status{Generation: 2, IngressIsolated: true, Denied: policy.Denied{Ingress: map[string]uint64{"Admin:x": 1}},
			Layers: &policy.LayerCounts{Admin: 2, NetworkPolicy: 1}}, "gen 2 in(1) admin 2 np 1 baseline 0"},
	} {
		if got := policyColumn(tc.p); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.p, got, tc.want)
		}
	}
}

// TestLabel: the pod when the attachment has one, else the short
// container ID.
func TestLabel(t *testing.T) {
	a := Attachment{ContainerID: "0123456789abcdef", Pod: "shop/web-0"}
	if got := a.Label(); got != "shop/web-0" {
		t.Errorf("got %q, want shop/web-0", got)
	}
	a.Pod = ""
	if got := a.Label(); got != "0123456789ab" {
		t.Errorf("without a pod: got %q, want 0123456789ab", got)
	}
	if got := ShortID("c1"); got != "c1" {
		t.Errorf("a short ID: got %q, want c1", got)
	}
}

// TestRunNoAttachments: an empty node prints the header alone, or an
// empty JSON array.
func TestRunNoAttachments(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if err := Run([]string{"--state-dir", dir}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "CONTAINER ") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("table: got %q, want the header alone", out.String())
	}
	out.Reset()
	if err := Run([]string{"--state-dir", dir, "--json"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != "[]" {
		t.Errorf("JSON: got %q, want []", got)
	}
}
