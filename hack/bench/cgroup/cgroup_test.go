package cgroup

import (
	"reflect"
	"testing"
)

func TestCFSQuota(t *testing.T) {
	for _, c := range []struct {
		cores float64
		want  int64
	}{{0.1, 10000}, {0.5, 50000}, {2, 200000}, {0.001, 1000}, {0.0125, 1300}, {0.005, 1000}} {
		if got := cfsQuotaUs(c.cores); got != c.want {
			t.Errorf("cfsQuotaUs(%v): got %d, want %d", c.cores, got, c.want)
		}
	}
}

func TestFindCgroupFS(t *testing.T) {
	const hybridSplit = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	const v1Joint = `25 24 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs ro,mode=755
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:12 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw shared:13 - cgroup cgroup rw,memory
`
	const v2 = `26 24 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	const cpuOnlyV1 = `30 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
`
	ctrls := map[string]string{"/sys/fs/cgroup/unified": "", "/sys/fs/cgroup": "cpuset cpu io memory pids\n"}
	read := func(dir string) string { return ctrls[dir] }
	for _, c := range []struct {
		name, mountinfo string
		want            FS
		fails           bool
	}{
		{"v1 split, empty unified mount", hybridSplit, FS{CPU: "/sys/fs/cgroup/cpu", CPUAcct: "/sys/fs/cgroup/cpuacct", Memory: "/sys/fs/cgroup/memory"}, false},
		{"v1 cpu,cpuacct", v1Joint, FS{CPU: "/sys/fs/cgroup/cpu,cpuacct", CPUAcct: "/sys/fs/cgroup/cpu,cpuacct", Memory: "/sys/fs/cgroup/memory"}, false},
		{"v2", v2, FS{V2: "/sys/fs/cgroup"}, false},
		{"v1 cpu without cpuacct", cpuOnlyV1, FS{}, true},
		{"unified without cpu", "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n", FS{}, true},
	} {
		got, err := findCgroupFS(parseMountinfo([]byte(c.mountinfo)), read)
		if (err != nil) != c.fails {
			t.Errorf("%s: got error %v, want failure %v", c.name, err, c.fails)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
	if m := parseMountinfo([]byte(`40 31 0:37 / /mnt/a\040b rw - cgroup cgroup rw,memory` + "\n")); len(m) != 1 || m[0].point != "/mnt/a b" {
		t.Errorf("escaped mount point: got %+v, want /mnt/a b", m)
	}
}

func TestParseProcCgroup(t *testing.T) {
	got := parseProcCgroup([]byte("4:memory:/ub-bench-sizing\n2:cpuacct:/\n1:cpu,cpuacct:/x\n0::/user.slice\n"))
	want := Placement{"memory": "/ub-bench-sizing", "cpu": "/x", "cpuacct": "/x", "": "/user.slice"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
