package stack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// nodeCPU reads how long the node's CPUs have been busy from /proc/stat,
// opened before the sandbox and read with pread, which the sandbox
// allows. /proc/stat is the whole node's whatever the stack's
// namespaces: the busy poller must know whether the node, not the pod,
// has a core to spare.
type nodeCPU struct {
	f    *os.File
	cpus int
	buf  []byte
}

// userHZ is the unit of /proc/stat's times: USER_HZ, 100 on every
// architecture Linux runs Go on.
const userHZ = 100

func openNodeCPU() (*nodeCPU, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return nil, fmt.Errorf("opening /proc/stat: %w", err)
	}
	c := &nodeCPU{f: f, buf: make([]byte, 64<<10)}
	n, err := c.read()
	if err != nil {
		f.Close()
		return nil, err
	}
	c.cpus = bytes.Count(c.buf[:n], []byte("\ncpu"))
	if _, err := c.busy(); err != nil || c.cpus == 0 {
		f.Close()
		return nil, fmt.Errorf("reading /proc/stat: %d CPUs, %v", c.cpus, err)
	}
	return c, nil
}

func (c *nodeCPU) read() (int, error) {
	n, err := unix.Pread(int(c.f.Fd()), c.buf, 0)
	if err != nil {
		return 0, fmt.Errorf("reading /proc/stat: %w", err)
	}
	return n, nil
}

// busy is the time the node's CPUs have been busy since boot, all of them
// together: the first line's user, nice, system, irq, softirq and steal
// (a hypervisor's steal is time nobody on the node can have).
func (c *nodeCPU) busy() (time.Duration, error) {
	n, err := c.read()
	if err != nil {
		return 0, err
	}
	return parseCPULine(c.buf[:n])
}

// parseCPULine reads the busy time of /proc/stat's first line,
// "cpu  user nice system idle iowait irq softirq steal ...".
func parseCPULine(b []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, errors.New("no cpu line")
	}
	var busy uint64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu line field %d: %w", i, err)
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / userHZ, nil
}
