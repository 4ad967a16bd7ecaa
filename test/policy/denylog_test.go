// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// The denial log's aggregation and the log's cap, as docs/policy.md and
// docs/security.md give them.
const (
	denialWindow     = 10 * time.Second
	denialKeys       = 10                  // keys followed, and first lines, per window
	linesPerWindow   = 2*denialKeys + 1    // first lines, their repeats' lines, the unlogged line
	testLogCap       = 8 << 10             // launch.LogMaxBytesEnv for this test
	logFiles         = 2                   // the log and the one rotated out
	floodFor         = 15 * time.Second    // how long the pod floods
	minFloodDenials  = 1000                // a flood that denied fewer tested nothing
	denialLogMessage = "network policy de" // "denied", "denied, repeated", "denials not logged"
)

// TestDeniedAllDay: a pod whose egress is denied and that sends as fast
// as it can, to many peers and ports, makes its stack log a bounded
// number of lines a window, and its log takes no more room on the node
// than its files' cap: the rotation works in the sandboxed stack.
func TestDeniedAllDay(t *testing.T) {
	t.Setenv(launch.LogMaxBytesEnv, fmt.Sprint(testLogCap))
	r := newRig(t)
	r.push(t, r.egressOnly())
	logDir := filepath.Dir(r.att.LogPath)

	// UDP from unconnected sockets: every datagram to a new peer and
	// port is a new flow, which the stack judges and denies.
	peers := []netip.Addr{r.allowed.IP(4), r.other.IP(4), r.allowed.IP(6), r.other.IP(6)}
	var sent atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	msg := []byte("denied")
	for g := range 2 {
		c4 := nettest.ListenUDP(t, r.pod.NS, ":0")
		c6 := nettest.ListenUDP(t, r.pod.NS, "[::]:0")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				peer := peers[(i+g)%len(peers)]
				to := netip.AddrPortFrom(peer, uint16(1024+(i*7+g)%60000))
				c := c4
				if peer.Is6() {
					c = c6
				}
				if _, err := c.WriteToUDPAddrPort(msg, to); err == nil {
					sent.Add(1)
				}
			}
		}()
	}
	time.Sleep(floodFor)
	close(stop)
	wg.Wait()
	// The summary of the last window, written by the stack's timer.
	time.Sleep(denialWindow + time.Second)

	st := r.status(t).Policy
	denied := st.Denied.Egress["test/out"]
	t.Logf("flood: %d datagrams sent, %d denials, %d without a line of their own", sent.Load(), denied, st.DenialLogsSuppressed)
	if denied < minFloodDenials {
		t.Fatalf("denials: got %d, want at least %d (the flood did not reach the stack)", denied, minFloodDenials)
	}
	// Each window has at most denialKeys denials with a line of their
	// own; the flood spans floodFor, so at most this many windows.
	windows := uint64(floodFor/denialWindow) + 2
	if own := denied - st.DenialLogsSuppressed; own > windows*denialKeys {
		t.Errorf("denials with a log line of their own: got %d over %s, want at most %d (%d a %s window)", own, floodFor, windows*denialKeys, denialKeys, denialWindow)
	}

	// The room the log takes: each of its files within the cap.
	var total int64
	entries, err := os.ReadDir(logDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
		t.Logf("%s: %d bytes", e.Name(), fi.Size())
	}
	if limit := int64(logFiles * testLogCap); total > limit {
		t.Errorf("log directory: got %d bytes, want at most %d (%d files of %d)", total, limit, logFiles, testLogCap)
	}
	rotated := launch.RotatedLog(r.att.LogPath)
	if fi, err := os.Stat(rotated); err != nil || fi.Size() == 0 {
		t.Errorf("rotated log %s: %v, want the lines rotated out of the full log", rotated, err)
	}

	// The lines the files still hold: whole JSON lines, and in no
	// window of denialWindow more than two windows' worth (a window's
	// summary is written at the start of the next).
	var times []time.Time
	for _, path := range []string{rotated, r.att.LogPath} {
		f, err := os.Open(path)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Errorf("%s: a line that is not JSON (cut by rotation?): %q", path, sc.Text())
				continue
			}
			if strings.HasPrefix(line.Msg, denialLogMessage) {
				times = append(times, line.Time)
			}
		}
		f.Close()
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i, j := 0, 0; j < len(times); j++ {
		for times[j].Sub(times[i]) >= denialWindow {
			i++
		}
		if n := j - i + 1; n > 2*linesPerWindow {
			t.Fatalf("denial log lines between %s and %s: got %d, want at most %d", times[i].Format(time.StampMilli), times[j].Format(time.StampMilli), n, 2*linesPerWindow)
		}
	}
}
