package reliability

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestStressAddDelWithTraffic runs ADD/DEL loops in parallel with traffic
// through a long-lived pod, with the agent supervising and reconciling,
// and with some pods' stacks killed and some namespaces deleted without a
// DEL: afterwards nothing is left — no veth, lease, process, state or lock
// file — and the long-lived pod's transfers were all byte-exact.
func TestStressAddDelWithTraffic(t *testing.T) {
	duration := 60 * time.Second
	if testing.Short() {
		duration = 10 * time.Second
	}
	env := nettest.NewEnv(t)
	conf := env.Conf("1.0.0", nil)
	startAgent(t, env)
	long := env.NewPod(conf)
	sums := sinkServer(t, env.Node, 7001)
	echoServer(t, env.Node, 7000)
	stop := make(chan struct{})

	// Traffic through the long-lived pod for the whole run.
	var transfers atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			want, err := send(long.NS, nettest.HostPort(long.Gateway(4), 7001), 8<<20, nil)
			if err != nil {
				t.Errorf("long-lived pod transfer: %v", err)
				return
			}
			select {
			case got := <-sums:
				if got != want {
					t.Errorf("long-lived pod transfer corrupted")
					return
				}
			case <-time.After(30 * time.Second):
				t.Errorf("long-lived pod transfer did not arrive")
				return
			}
			transfers.Add(1)
		}
	}()

	var cycles, killed, lost atomic.Int64
	deadline := time.Now().Add(duration)
	// Every pod namespace made below is removed at the end if its own path
	// missed it: a run left one mounted, empty namespace behind now and
	// then (the pod's own teardown had run; which path skipped the unmount
	// is not known), and the machine must be left as it was.
	var madeMu sync.Mutex
	var made []string
	t.Cleanup(func() {
		madeMu.Lock()
		defer madeMu.Unlock()
		left := 0
		for _, p := range made {
			if unix.Unmount(p, unix.MNT_DETACH) == nil {
				left++
			}
			os.Remove(p)
		}
		if left > 0 {
			t.Logf("removed %d pod namespace(s) still mounted at the end", left)
		}
	})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; time.Now().Before(deadline) && !t.Failed(); i++ {
				id := fmt.Sprintf("stress-%d-%d", w, i)
				podNS, err := testutils.NewNS()
				if err != nil {
					t.Errorf("netns: %v", err)
					return
				}
				madeMu.Lock()
				made = append(made, podNS.Path())
				madeMu.Unlock()
				res, err := env.Add(conf, id, podNS)
				if err != nil {
					t.Errorf("ADD %s: %v", id, err)
					podNS.Close()
					testutils.UnmountNS(podNS)
					return
				}
				pod := &nettest.Pod{ID: id, NS: podNS, Conf: conf, Result: res}
				if err := roundTrip(pod.NS, nettest.HostPort(pod.Gateway(4), 7000)); err != nil {
					t.Errorf("pod %s: %v", id, err)
				}
				switch rng.IntN(5) {
				case 0: // its stack dies; DEL comes while the agent restarts it
					att, err := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(id, "eth0")
					if err == nil {
						syscall.Kill(att.StackPID, syscall.SIGKILL)
					}
					killed.Add(1)
					time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				case 1: // the runtime loses the pod: no DEL, netns gone
					att, _ := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(id, "eth0")
					if att != nil {
						syscall.Kill(att.StackPID, syscall.SIGKILL)
					}
					loseNetns(t, podNS)
					lost.Add(1)
					cycles.Add(1)
					continue
				}
				if err := env.Del(conf, id, podNS); err != nil {
					t.Errorf("DEL %s: %v", id, err)
				}
				podNS.Close()
				testutils.UnmountNS(podNS)
				cycles.Add(1)
			}
		}()
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	t.Logf("%d ADD/DEL cycles (%d stacks killed, %d pods lost without DEL), %d transfers of 8 MiB through the long-lived pod",
		cycles.Load(), killed.Load(), lost.Load(), transfers.Load())
	if transfers.Load() == 0 || cycles.Load() < 8 {
		t.Fatalf("too little happened to prove anything")
	}
	if err := env.Del(conf, long.ID, long.NS); err != nil {
		t.Fatal(err)
	}
	// Lost pods are the reconciler's (every second here).
	var leaks []string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		leaks = env.Leaks()
		locks, _ := filepath.Glob(filepath.Join(env.Dir, "state", "locks", "*"))
		for _, l := range locks {
			leaks = append(leaks, "lock "+filepath.Base(l))
		}
		if len(leaks) == 0 {
			return
		}
	}
	t.Fatalf("left behind: %v", leaks)
}
