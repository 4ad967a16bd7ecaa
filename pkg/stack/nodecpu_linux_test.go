package stack

import (
	"runtime"
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

// TestNodeCPUReadsTheNode: the reader counts the node's CPUs, and a
// goroutine that spins shows in the node's busy time.
func TestNodeCPUReadsTheNode(t *testing.T) {
	c, err := openNodeCPU()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.f.Close() })
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
}
