package denials

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/cli/status"
)

var zone = time.FixedZone("node", 3600)

func denialAt(sec int, dir, proto, peer string, port uint16) policy.Denial {
	return policy.Denial{Time: time.Date(2026, 12, 3, 10, 0, sec, 123e6, zone), Direction: dir, Protocol: proto,
		Peer: netip.MustParseAddr(peer), Port: port, Local: netip.MustParseAddr("10.244.1.5"),
		Policies: "shop/web", Reason: "no rule admits", Generation: 12}
}

// TestDenialsOf: an attachment's recent denials carry its pod, or its
// container when it has none; a stack without policy has none.
func TestDenialsOf(t *testing.T) {
	d := denialAt(1, "ingress", "TCP", "10.244.2.9", 8080)
	st := status.Attachment{ContainerID: "0123456789abcdef", IfName: "eth0", Pod: "shop/web-0", Healthy: true,
		Stats: &control.Status{Policy: &policy.Status{RecentDenials: []policy.Denial{d}}}}
	got := denialsOf(st)
	if len(got) != 1 || got[0].Pod != "shop/web-0" || got[0].ContainerID != st.ContainerID || got[0].IfName != "eth0" || got[0].Denial != d {
		t.Errorf("got %+v", got)
	}
	st.Pod = ""
	if got := denialsOf(st); len(got) != 1 || got[0].Pod != "0123456789ab" {
		t.Errorf("without a pod: got %+v, want the short container ID", got)
	}
	st.Stats.Policy = nil
	if got := denialsOf(st); len(got) != 0 {
		t.Errorf("policy off: got %+v", got)
	}
}

// TestPrintDenials: one line per denial, oldest first as given, with the
// time to the millisecond in the stack's zone; "-" for what a denial has
// not (a ping's port).
func TestPrintDenials(t *testing.T) {
	rows := []podDenial{
		{Pod: "shop/web-0", Denial: denialAt(1, "ingress", "TCP", "10.244.2.9", 8080)},
		{Pod: "shop/db-0", Denial: denialAt(2, "egress", "ICMPv6", "fd00::9", 0)},
		{Pod: "shop/web-0", Denial: denialAt(3, "ingress", "TCP", "10.244.3.1", 22)},
	}
	rows[0].Layer = policy.TierNetworkPolicy
	rows[1].Local, rows[1].Policies, rows[1].Reason = netip.Addr{}, "(pending)", "no rule admits"
	rows[2].Layer, rows[2].Policies, rows[2].Reason = policy.TierAdmin, "no-ssh", "admin tier deny"
	var b bytes.Buffer
	printDenials(&b, rows)
	want := strings.Join([]string{
		"TIME                 POD         DIRECTION  PROTO   PEER        PORT  LOCAL       LAYER          POLICIES   REASON",
		"Dec  3 10:00:01.123  shop/web-0  INGRESS    TCP     10.244.2.9  8080  10.244.1.5  NetworkPolicy  shop/web   no rule admits",
		"Dec  3 10:00:02.123  shop/db-0   EGRESS     ICMPv6  fd00::9     -     -           -              (pending)  no rule admits",
		"Dec  3 10:00:03.123  shop/web-0  INGRESS    TCP     10.244.3.1  22    10.244.1.5  Admin          no-ssh     admin tier deny",
		""}, "\n")
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestRunDenialsNoStacks: a node without attachments prints the header,
// or an empty JSON array; arguments are refused.
func TestRunDenialsNoStacks(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if err := Run([]string{"--state-dir", dir}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "TIME ") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("table: got %q, want the header alone", out.String())
	}
	out.Reset()
	if err := Run([]string{"--state-dir", dir, "-json"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var rows []podDenial
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || rows == nil || len(rows) != 0 {
		t.Errorf("JSON: got %q (%v), want []", out.String(), err)
	}
	if err := Run([]string{"--state-dir", dir, "shop/web-0"}, &out, &errOut); err == nil {
		t.Error("an argument was taken")
	}
}

// TestDenialJSON: -json prints each denial flat, with its pod.
func TestDenialJSON(t *testing.T) {
	b, err := json.Marshal(podDenial{Pod: "shop/web-0", ContainerID: "c1", IfName: "eth0", Denial: denialAt(1, "ingress", "UDP", "10.244.2.9", 53)})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"pod":"shop/web-0","containerID":"c1","ifName":"eth0","time":"2026-12-03T10:00:01.123+01:00","direction":"ingress",` +
		`"protocol":"UDP","peer":"10.244.2.9","port":53,"local":"10.244.1.5","policies":"shop/web","reason":"no rule admits","generation":12}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}
