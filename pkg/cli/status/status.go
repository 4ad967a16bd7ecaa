// Package status is `cni-usernet status`: every attachment on the node
// with its stack's health, GSO decision and counters, read from the state
// directory and each stack's control socket. The other commands that
// speak of attachments (denials, capture) read them through it.
package status

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
)

// Attachment is one row of `cni-usernet status`: an attachment and what
// its stack says of itself.
type Attachment struct {
	ContainerID string   `json:"containerID"`
	IfName      string   `json:"ifName"`
	Pod         string   `json:"pod,omitempty"`
	IPs         []string `json:"ips"`
	PID         int      `json:"pid"`
	Healthy     bool     `json:"healthy"`
	Problem     string   `json:"problem,omitempty"`
	// Restarts is how often the node agent restarted the stack.
	Restarts int             `json:"restarts"`
	GSO      GSO             `json:"gso"`
	Stats    *control.Status `json:"stats,omitempty"`
	// Redirect is the pod's socket redirect; nil in records made before
	// it.
	Redirect *Redirect `json:"socketRedirect,omitempty"`
}

// Redirect is the pod's socket redirect (pkg/node/sockmap): off, on
// (towards the stack), or both, why, and the node's counters of the pod.
type Redirect struct {
	Mode   string `json:"mode"`
	Reason string `json:"reason,omitempty"`
	// Services: with direct, whether connections through a Service's
	// cluster IP join too, and when not, why.
	Services    bool           `json:"services,omitempty"`
	ServicesOff string         `json:"servicesOff,omitempty"`
	Stats       *sockmap.Stats `json:"stats,omitempty"`
}

// redirectOf reads the record's redirect and, where the node's programs
// answer, the pod's counters.
func redirectOf(r *state.SocketRedirect) *Redirect {
	if r == nil {
		return nil
	}
	out := &Redirect{Mode: "off", Reason: r.Reason}
	if !r.On {
		return out
	}
	out.Mode = "on"
	if r.Both {
		out.Mode = "both"
	}
	if r.Direct {
		out.Mode = "direct"
		out.Services, out.ServicesOff = r.Services, r.ServicesOff
	}
	if node, err := sockmap.Open(r.BPFDir); err == nil {
		if s, err := node.Stats(r.NetnsCookie); err == nil {
			out.Stats = &s
		}
		node.Close()
	}
	return out
}

// GSO is the attachment's GSO decision: the stack's when it answers,
// else the one recorded at ADD.
type GSO struct {
	Mode    string `json:"mode"`
	MaxSize uint32 `json:"maxSize"`
	MaxSegs uint32 `json:"maxSegs"`
	Reason  string `json:"reason,omitempty"`
}

// Run is `cni-usernet status [--json] [--state-dir DIR]`. With --json,
// stdout stays one JSON document and the unreadable state files go to
// stderr; in the table they follow it on stdout.
func Run(argv []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(errOut)
	asJSON := fs.Bool("json", false, "print a JSON array")
	dir := fs.String("state-dir", netconf.DefaultStateDir, "state directory of the plugin")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	atts, errs := state.Store{Dir: *dir}.List()
	rows := make([]Attachment, 0, len(atts))
	for _, a := range atts {
		rows = append(rows, Of(a))
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
	} else {
		printTable(out, rows)
	}
	if !*asJSON {
		errOut = out
	}
	for _, e := range errs {
		fmt.Fprintln(errOut, "unreadable:", e)
	}
	return nil
}

// Of is a's row: its record, and when its stack runs and answers on the
// control socket, the stack's status; else Problem says why not.
func Of(a *state.Attachment) Attachment {
	s := Attachment{
		ContainerID: a.ContainerID, IfName: a.IfName, IPs: a.IPs, PID: a.StackPID,
		GSO: GSO{Mode: string(a.GSO.Mode), MaxSize: a.GSO.Link.MaxSize, MaxSegs: a.GSO.Link.MaxSegs, Reason: a.GSO.Reason},
	}
	if a.PodName != "" {
		s.Pod = a.PodNS + "/" + a.PodName
	}
	s.Redirect = redirectOf(a.SocketRedirect)
	if s.IPs == nil {
		s.IPs = []string{}
	}
	if sv := a.Supervision; sv != nil {
		s.Restarts = sv.Restarts
		if sv.Unhealthy != "" {
			s.Problem = sv.Unhealthy
			return s
		}
	}
	if !launch.Alive(launch.Process{PID: a.StackPID, StartTime: a.StackStartTime}) {
		s.Problem = fmt.Sprintf("stack process %d is not running", a.StackPID)
		if sv := a.Supervision; sv != nil && !sv.NextRestart.IsZero() {
			s.Problem += fmt.Sprintf(" (exited: %s; restart at %s)", sv.LastReason, sv.NextRestart.Format(time.RFC3339))
		}
		return s
	}
	if err := control.Health(a.ControlSocket, time.Second); err != nil {
		s.Problem = err.Error()
		return s
	}
	var st control.Status
	if err := control.FetchStatus(a.ControlSocket, time.Second, &st); err != nil {
		s.Problem = err.Error()
		return s
	}
	s.Healthy = true
	s.Stats = &st
	s.GSO = GSO{Mode: string(st.GSO.Mode), MaxSize: st.GSO.Link.MaxSize, MaxSegs: st.GSO.Link.MaxSegs, Reason: st.GSO.Reason}
	return s
}

func printTable(out io.Writer, rows []Attachment) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tIF\tPOD\tIPS\tPID\tHEALTHY\tGSO\tGSO_MAX_SIZE\tGSO_MAX_SEGS\tGSO_BATCHES\tTX/RX PKTS\tTCP RELAYS\tPOLICY\tREDIRECT")
	for _, r := range rows {
		id := ShortID(r.ContainerID)
		var ips []string
		for _, ip := range r.IPs {
			if p, err := netip.ParsePrefix(ip); err == nil {
				ip = p.Addr().String()
			}
			ips = append(ips, ip)
		}
		batches, pkts, relays, pol := "-", "-", "-", "-"
		if r.Stats != nil {
			pol = policyColumn(r.Stats.Policy)
			batches = fmt.Sprint(r.Stats.Wire.TxGSOBatches)
			pkts = fmt.Sprintf("%d/%d", r.Stats.Wire.TxPackets, r.Stats.Wire.RxPackets)
			relays = fmt.Sprintf("%d (total %d)", r.Stats.Relay.TCPActive, r.Stats.Relay.TCPTotal)
		}
		healthy := "yes"
		if !r.Healthy {
			healthy = "NO: " + r.Problem
		}
		pod := r.Pod
		if pod == "" {
			pod = "-"
		}
		redirect := "-"
		if d := r.Redirect; d != nil {
			redirect = d.Mode
			if d.Stats != nil {
				if d.Stats.Direct > 0 {
					redirect += fmt.Sprintf(" (%d msgs, %d to another pod)", d.Stats.Redirected, d.Stats.Direct)
				} else {
					redirect += fmt.Sprintf(" (%d msgs)", d.Stats.Redirected)
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", id, r.IfName, pod, strings.Join(ips, ","),
			r.PID, healthy, r.GSO.Mode, r.GSO.MaxSize, r.GSO.MaxSegs, batches, pkts, relays, pol, redirect)
	}
	tw.Flush()
	for _, r := range rows {
		if r.GSO.Reason != "" {
			fmt.Fprintf(out, "%s/%s gso: %s\n", ShortID(r.ContainerID), r.IfName, r.GSO.Reason)
		}
		if d := r.Redirect; d != nil && d.Reason != "" {
			fmt.Fprintf(out, "%s/%s socket redirect %s: %s\n", ShortID(r.ContainerID), r.IfName, d.Mode, d.Reason)
		}
		if d := r.Redirect; d != nil && d.ServicesOff != "" {
			fmt.Fprintf(out, "%s/%s socket redirect %s, no joins through a Service: %s\n", ShortID(r.ContainerID), r.IfName, d.Mode, d.ServicesOff)
		}
	}
}

// policyColumn is the network policy in force: "off", or its generation
// and the isolated directions with their denials, e.g. "gen 7 in(12) out(0)";
// "open" when neither direction is isolated. When ClusterNetworkPolicies
// apply, the policies of each layer in the order they are asked follow:
// "admin 1 np 2 baseline 1".
func policyColumn(p *policy.Status) string {
	if p == nil {
		return "off"
	}
	s := fmt.Sprintf("gen %d", p.Generation)
	sum := func(m map[string]uint64) (n uint64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	if p.IngressIsolated {
		s += fmt.Sprintf(" in(%d)", sum(p.Denied.Ingress))
	}
	if p.EgressIsolated {
		s += fmt.Sprintf(" out(%d)", sum(p.Denied.Egress))
	}
	if !p.IngressIsolated && !p.EgressIsolated {
		s += " open"
	}
	if l := p.Layers; l != nil {
		s += fmt.Sprintf(" admin %d np %d baseline %d", l.Admin, l.NetworkPolicy, l.Baseline)
	}
	return s
}

// Label is how the commands name the attachment's pod: "namespace/name",
// or the short container ID of an attachment without one.
func (s Attachment) Label() string { return cmp.Or(s.Pod, ShortID(s.ContainerID)) }

// ShortID is a container ID as the commands print it, by its first 12
// characters as the runtimes' tools do.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
