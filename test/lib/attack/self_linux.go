package attack

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Confinement is how the attacker runs: what the Self attack reports, so
// that a test can check that it attacked as a container would.
type Confinement struct {
	UID int `json:"uid"`
	// PID is its pid as it sees it; NSpid its pids from the outermost pid
	// namespace in, one per level (more than one: a pid namespace of its
	// own).
	PID   int   `json:"pid"`
	NSpid []int `json:"nspid"`
	// Effective, Permitted, Bounding, Inheritable and Ambient are the
	// capability sets, as /proc/self/status writes them (hex).
	Effective   uint64 `json:"capEff"`
	Permitted   uint64 `json:"capPrm"`
	Bounding    uint64 `json:"capBnd"`
	Inheritable uint64 `json:"capInh"`
	Ambient     uint64 `json:"capAmb"`
	// Caps names the effective capabilities.
	Caps []string `json:"caps"`
	// NetNS, MntNS and PidNS are its namespaces ("net:[4026531840]").
	NetNS string `json:"netns"`
	MntNS string `json:"mntns"`
	PidNS string `json:"pidns"`
	// Visible are the paths of Spec.Hidden it can see.
	Visible []string `json:"visible,omitempty"`
}

// capNames are the capabilities by number (linux/capability.h).
var capNames = []string{
	"chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid",
	"setpcap", "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw", "ipc_lock", "ipc_owner",
	"sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot", "sys_nice",
	"sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write", "audit_control", "setfcap",
	"mac_override", "mac_admin", "syslog", "wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf",
	"checkpoint_restore",
}

// CapMask is the set of the named capabilities ("net_raw", "cap_net_raw",
// "NET_RAW" alike); an unknown name is an error.
func CapMask(names ...string) (uint64, error) {
	var m uint64
	for _, n := range names {
		n = strings.TrimPrefix(strings.ToLower(n), "cap_")
		i := -1
		for j, c := range capNames {
			if c == n {
				i = j
			}
		}
		if i < 0 {
			return 0, fmt.Errorf("unknown capability %q", n)
		}
		m |= 1 << i
	}
	return m, nil
}

// CapList names the capabilities of a mask.
func CapList(m uint64) []string {
	var out []string
	for i := 0; i < 64; i++ {
		if m&(1<<i) == 0 {
			continue
		}
		if i < len(capNames) {
			out = append(out, capNames[i])
		} else {
			out = append(out, fmt.Sprintf("cap%d", i))
		}
	}
	return out
}

// ReadConfinement reads the calling process's confinement.
func ReadConfinement(hidden []string) (*Confinement, error) {
	c := &Confinement{UID: os.Getuid(), PID: os.Getpid()}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		hex := func(dst *uint64) error {
			n, err := strconv.ParseUint(v, 16, 64)
			*dst = n
			return err
		}
		switch k {
		case "CapEff":
			err = hex(&c.Effective)
		case "CapPrm":
			err = hex(&c.Permitted)
		case "CapBnd":
			err = hex(&c.Bounding)
		case "CapInh":
			err = hex(&c.Inheritable)
		case "CapAmb":
			err = hex(&c.Ambient)
		case "NSpid":
			for _, f := range strings.Fields(v) {
				n, _ := strconv.Atoi(f)
				c.NSpid = append(c.NSpid, n)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s %q: %w", k, v, err)
		}
	}
	c.Caps = CapList(c.Effective)
	for _, ns := range []struct {
		name string
		dst  *string
	}{{"net", &c.NetNS}, {"mnt", &c.MntNS}, {"pid", &c.PidNS}} {
		if *ns.dst, err = os.Readlink("/proc/self/ns/" + ns.name); err != nil {
			return nil, err
		}
	}
	for _, h := range hidden {
		if _, err := os.Lstat(h); err == nil {
			c.Visible = append(c.Visible, h)
		}
	}
	return c, nil
}

func (r *runner) self() {
	c, err := ReadConfinement(r.s.Hidden)
	o := Outcome{Attack: Self, Case: "confinement", Self: c}
	if err != nil {
		o.Err = err.Error()
	} else {
		o.Sent = true
		o.Detail = fmt.Sprintf("uid %d pid %d (nspid %v), capabilities %v, %s %s %s",
			c.UID, c.PID, c.NSpid, c.Caps, c.NetNS, c.MntNS, c.PidNS)
	}
	r.emit(o)
}
