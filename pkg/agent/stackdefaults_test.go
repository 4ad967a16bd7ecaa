// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/supervisor"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// The node's stack defaults given to the agent reach the conflist entry
// it writes, in both modes, and the plugin reads them from there; unset,
// the keys stay out (the plugin's defaults).
func TestPluginConfStackDefaults(t *testing.T) {
	for _, mode := range []string{"standalone", "chain"} {
		args := []string{"--mode", mode, "--subnet", "10.244.1.0/24", "--network-policy=false",
			"--stack-cgroup=node", "--busy-poll=0s", "--stack-threads=2", "--socket-redirect=on"}
		f, err := parseAgentFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		b, err := (&nodeSetup{f: f}).pluginConf(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]any{"stackCgroup": "node", "busyPoll": "0s", "stackThreads": 2.0, "socketRedirect": "on"} {
			if p[key] != want {
				t.Errorf("%s: entry %s: %s is %v, want %v", mode, b, key, p[key], want)
			}
		}
		// The entry as the plugin reads it.
		p["cniVersion"], p["name"] = "1.1.0", "cni-usernet"
		if mode == "chain" {
			p["ipam"] = map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": "10.244.1.0/24"}}}}
		}
		conf, _ := json.Marshal(p)
		c, err := netconf.Parse(conf)
		if err != nil {
			t.Fatalf("%s: the plugin refuses the entry: %v\n%s", mode, err, conf)
		}
		if c.StackCgroup != "node" || c.BusyPoll != "0s" || c.StackThreads != 2 || c.SocketRedirect != "on" {
			t.Errorf("%s: the plugin reads %+v", mode, c)
		}

		f, err = parseAgentFlags([]string{"--mode", mode, "--subnet", "10.244.1.0/24"})
		if err != nil {
			t.Fatal(err)
		}
		b, err = (&nodeSetup{f: f}).pluginConf(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"stackCgroup", "busyPoll", "stackThreads", "socketRedirect"} {
			if strings.Contains(string(b), `"`+key+`"`) {
				t.Errorf("%s, no flag: entry %s carries %s, want the plugin's default", mode, b, key)
			}
		}
	}
}

// A stack default the plugin would refuse stops the agent at its flags,
// with the flag's name, instead of failing every pod's ADD on the node.
func TestStackDefaultFlagsRefused(t *testing.T) {
	for _, arg := range []string{"--stack-cgroup=kubepods", "--busy-poll=1s", "--busy-poll=fast", "--stack-threads=-1", "--stack-threads=100000", "--socket-redirect=yes"} {
		_, err := parseAgentFlags([]string{arg})
		flag := strings.SplitN(arg, "=", 2)[0]
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: got %v, want an error naming %s", arg, err, flag)
		}
	}
	for _, arg := range []string{"--stack-cgroup=pod", "--busy-poll=auto", "--busy-poll=200us", "--stack-threads=1", "--socket-redirect=both"} {
		if _, err := parseAgentFlags([]string{arg}); err != nil {
			t.Errorf("%s: %v", arg, err)
		}
	}
}

// /healthz answers ok while the supervisor reconciles (and while it
// starts), 503 once three intervals went by without a pass.
func TestHealthz(t *testing.T) {
	var stats supervisor.Stats
	now := time.Unix(1000, 0)
	h := health{stats: &stats, interval: 10 * time.Second, now: func() time.Time { return now }}
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code
	}
	if c := get(); c != http.StatusOK {
		t.Errorf("starting: got %d, want 200", c)
	}
	stats.LastReconcile.Store(now.Add(-25 * time.Second).UnixNano())
	if c := get(); c != http.StatusOK {
		t.Errorf("reconciled 25s ago, interval 10s: got %d, want 200", c)
	}
	stats.LastReconcile.Store(now.Add(-31 * time.Second).UnixNano())
	if c := get(); c != http.StatusServiceUnavailable {
		t.Errorf("reconciled 31s ago, interval 10s: got %d, want 503", c)
	}
}

// The supervisor records each pass, which /healthz reads.
func TestReconcileRecordsPass(t *testing.T) {
	sup := supervisor.New(supervisor.Config{Store: state.Store{Dir: t.TempDir()}, Log: slog.New(slog.DiscardHandler)})
	sup.Reconcile()
	if sup.Stats().LastReconcile.Load() == 0 {
		t.Errorf("LastReconcile 0 after a pass")
	}
}
