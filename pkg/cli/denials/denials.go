// Package denials is `cni-usernet denials`: the recent network policy
// denials of every local stack that enforces policy, one list, oldest
// first. It reads what `cni-usernet status` reads (pkg/cli/status) and
// prints another view of it; a package of its own so that each command
// of the plugin's binary is one package with its flags and output.
package denials

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/cli/status"
)

// podDenial is one line of `cni-usernet denials`: a stack's recent
// denial and the attachment it belongs to.
type podDenial struct {
	// Pod is "namespace/name", or the container ID's first 12
	// characters for an attachment without one.
	Pod         string `json:"pod"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	policy.Denial
}

// Run prints the recent denials of every local stack that
// enforces network policy, oldest first, as `hubble observe --verdict
// DROPPED` lists flows: what each stack keeps (policy.RecentDenials per
// stack), read from the status `cni-usernet status` reads.
func Run(argv []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("denials", flag.ContinueOnError)
	fs.SetOutput(errOut)
	asJSON := fs.Bool("json", false, "print a JSON array")
	dir := fs.String("state-dir", netconf.DefaultStateDir, "state directory of the plugin")
	pod := fs.String("pod", "", "only this pod (namespace/name) or container (an ID or its prefix)")
	last := fs.Int("last", 0, "only the last `N` denials (0: all the stacks keep)")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("denials takes no arguments, got %q", fs.Args())
	}
	atts, errs := state.Store{Dir: *dir}.List()
	var rows []podDenial
	for _, a := range atts {
		if *pod != "" && a.PodNS+"/"+a.PodName != *pod && !strings.HasPrefix(a.ContainerID, *pod) {
			continue
		}
		st := status.Of(a)
		if !st.Healthy {
			fmt.Fprintf(errOut, "%s: no status: %s\n", st.Label(), st.Problem)
			continue
		}
		rows = append(rows, denialsOf(st)...)
	}
	for _, e := range errs {
		fmt.Fprintln(errOut, "unreadable:", e)
	}
	slices.SortStableFunc(rows, func(a, b podDenial) int { return a.Time.Compare(b.Time) })
	if *last > 0 && len(rows) > *last {
		rows = rows[len(rows)-*last:]
	}
	if *asJSON {
		if rows == nil {
			rows = []podDenial{}
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	printDenials(out, rows)
	return nil
}

// denialsOf is the recent denials in one attachment's status; none when
// its stack does not enforce policy.
func denialsOf(st status.Attachment) []podDenial {
	if st.Stats == nil || st.Stats.Policy == nil {
		return nil
	}
	rows := make([]podDenial, 0, len(st.Stats.Policy.RecentDenials))
	for _, d := range st.Stats.Policy.RecentDenials {
		rows = append(rows, podDenial{Pod: st.Label(), ContainerID: st.ContainerID, IfName: st.IfName, Denial: d})
	}
	return rows
}

// denialTime is how a denial's time is printed: to the millisecond, in
// the stack's time zone (the node's), as hubble prints flows.
const denialTime = time.StampMilli

func printDenials(out io.Writer, rows []podDenial) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tPOD\tDIRECTION\tPROTO\tPEER\tPORT\tLOCAL\tLAYER\tPOLICIES\tREASON")
	for _, r := range rows {
		peer, port, local := "-", "-", "-"
		if r.Peer.IsValid() {
			peer = r.Peer.String()
		}
		if r.Port != 0 {
			port = fmt.Sprint(r.Port)
		}
		if r.Local.IsValid() {
			local = r.Local.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.Format(denialTime), r.Pod, strings.ToUpper(r.Direction),
			r.Protocol, peer, port, local, cmp.Or(string(r.Layer), "-"), r.Policies, r.Reason)
	}
	tw.Flush()
}
