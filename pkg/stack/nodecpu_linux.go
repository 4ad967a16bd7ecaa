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

// nodeCPU reads how long the node's CPUs have been busy from /proc/stat
// and how long tasks waited for one from /proc/pressure/cpu (the
// kernel's pressure stall information, PSI), both opened before the
// sandbox and read with pread, which the sandbox allows. Both are the
// whole node's whatever the stack's namespaces: the busy poller must know
// whether the node, not the pod, has idle CPU.
type nodeCPU struct {
	f, pressure *os.File
	cpus        int
	buf         []byte
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
	// A kernel without PSI (CONFIG_PSI off, or psi=0 on its command line)
	// has no /proc/pressure: busy time alone cannot tell idle from a
	// contended node, and busy polling stays off.
	if c.pressure, err = os.Open("/proc/pressure/cpu"); err != nil {
		c.close()
		return nil, fmt.Errorf("opening the node's CPU pressure: %w", err)
	}
	n, err := c.read(c.f)
	if err != nil {
		c.close()
		return nil, err
	}
	c.cpus = bytes.Count(c.buf[:n], []byte("\ncpu"))
	if _, _, err := c.sample(); err != nil || c.cpus == 0 {
		c.close()
		return nil, fmt.Errorf("reading the node's CPU load: %d CPUs, %v", c.cpus, err)
	}
	return c, nil
}

func (c *nodeCPU) close() {
	c.f.Close()
	if c.pressure != nil {
		c.pressure.Close()
	}
}

func (c *nodeCPU) read(f *os.File) (int, error) {
	n, err := unix.Pread(int(f.Fd()), c.buf, 0)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return n, nil
}

// sample is busy and the time some task waited for a CPU, since boot.
func (c *nodeCPU) sample() (busy, wait time.Duration, err error) {
	if busy, err = c.busy(); err != nil {
		return 0, 0, err
	}
	n, err := c.read(c.pressure)
	if err != nil {
		return 0, 0, err
	}
	wait, err = parsePressure(c.buf[:n])
	return busy, wait, err
}

// parsePressure reads the "some" line's total, in microseconds, of a
// pressure file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234".
func parsePressure(b []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	if !bytes.HasPrefix(line, []byte("some ")) {
		return 0, errors.New("no some line in the pressure file")
	}
	_, total, ok := bytes.Cut(line, []byte(" total="))
	if !ok {
		return 0, errors.New("no total in the pressure file")
	}
	us, err := strconv.ParseUint(string(bytes.TrimSpace(total)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pressure total: %w", err)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// busy is the time the node's CPUs have been busy since boot, all of them
// together: the first line's user, nice, system, irq, softirq and steal
// (a hypervisor's steal is time nobody on the node can have).
func (c *nodeCPU) busy() (time.Duration, error) {
	n, err := c.read(c.f)
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
