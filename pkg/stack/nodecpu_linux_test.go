package stack

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestParseCPULine(t *testing.T) {
	b := []byte("cpu  1833722 75000 1569008 6673360 23584 100 240219 46254 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	got, err := parseCPULine(b)
	// user + nice + system + irq + softirq + steal, not idle or iowait.
	want := time.Duration(1833722+75000+1569008+100+240219+46254) * 10 * time.Millisecond
	if err != nil || got != want {
		t.Fatalf("parseCPULine: %s, %v; want %s", got, err, want)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu  1 2 3\n", "cpu  1 2 x 4 5 6 7 8 9 10\n"} {
		if d, err := parseCPULine([]byte(bad)); err == nil {
			t.Errorf("parseCPULine(%q) = %s, want an error", bad, d)
		}
	}
}

func TestParsePressure(t *testing.T) {
	got, err := parsePressure([]byte("some avg10=5.42 avg60=1.61 avg300=5.75 total=12782951904\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"))
	if want := 12782951904 * time.Microsecond; err != nil || got != want {
		t.Fatalf("parsePressure: %s, %v; want %s", got, err, want)
	}
	for _, bad := range []string{"", "full avg10=0 total=1\n", "some avg10=0.00\n", "some total=x\n"} {
		if d, err := parsePressure([]byte(bad)); err == nil {
			t.Errorf("parsePressure(%q) = %s, want an error", bad, d)
		}
	}
}

// TestNodeCPUReadsTheNode: the reader counts the node's CPUs, and a
// goroutine that spins shows in the node's busy time.
func TestNodeCPUReadsTheNode(t *testing.T) {
	c, err := openNodeCPU()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	if c.cpus < runtime.NumCPU() {
		t.Fatalf("%d CPUs in /proc/stat, the process may use %d", c.cpus, runtime.NumCPU())
	}
	before, err := c.busy()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := c.busy()
	if err != nil {
		t.Fatal(err)
	}
	// 300 ms of one core spinning: at least most of it, in 10 ms ticks.
	if d := after - before; d < 200*time.Millisecond {
		t.Fatalf("the node was busy %s while a core spun for 300 ms", d)
	}
	// Three spinners per CPU for 300 ms: tasks wait for a CPU most of it.
	_, w0, err := c.sample()
	if err != nil {
		t.Fatal(err)
	}
	// As many threads as spinners: goroutines on GOMAXPROCS threads
	// would take turns in Go's scheduler, not wait in the kernel's.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3 * runtime.NumCPU()))
	var wg sync.WaitGroup
	for range 3 * runtime.NumCPU() {
		wg.Go(func() {
			for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
			}
		})
	}
	wg.Wait()
	_, w1, err := c.sample()
	if err != nil {
		t.Fatal(err)
	}
	if w1-w0 < 100*time.Millisecond {
		t.Fatalf("tasks waited %s for a CPU in 300 ms of three spinners per CPU", w1-w0)
	}
}
