package main

import (
	"reflect"
	"testing"
)

func TestParseCPULimits(t *testing.T) {
	got, err := parseCPULimits("100m, 0.5,2,max")
	if err != nil {
		t.Fatal(err)
	}
	want := []cpuLimit{{"100m", 0.1}, {"0.5", 0.5}, {"2", 2}, {"max", 0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := parseCPULimits(""); err != nil || len(got) != 0 {
		t.Errorf("empty: got %v, %v; want none, nil", got, err)
	}
	for _, bad := range []string{"5m", "0", "-1", "1.5m", "one", "100m,100m", "1000"} {
		if _, err := parseCPULimits(bad); err == nil {
			t.Errorf("%q: got no error", bad)
		}
	}
}

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
		want            cgroupFS
		fails           bool
	}{
		{"v1 split, empty unified mount", hybridSplit, cgroupFS{CPU: "/sys/fs/cgroup/cpu", CPUAcct: "/sys/fs/cgroup/cpuacct", Memory: "/sys/fs/cgroup/memory"}, false},
		{"v1 cpu,cpuacct", v1Joint, cgroupFS{CPU: "/sys/fs/cgroup/cpu,cpuacct", CPUAcct: "/sys/fs/cgroup/cpu,cpuacct", Memory: "/sys/fs/cgroup/memory"}, false},
		{"v2", v2, cgroupFS{V2: "/sys/fs/cgroup"}, false},
		{"v1 cpu without cpuacct", cpuOnlyV1, cgroupFS{}, true},
		{"unified without cpu", "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n", cgroupFS{}, true},
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
	want := placement{"memory": "/ub-bench-sizing", "cpu": "/x", "cpuacct": "/x", "": "/user.slice"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// A row under a limit is compared with the kernel veth under the same
// limit, never with the unlimited kernel row.
func TestLimitRatios(t *testing.T) {
	b := &bench{samples: []sample{
		{1, "kernel", "tcp_n2p_gbps", 20},
		{1, "kernel@100m", "tcp_n2p_gbps", 4},
		{1, "usernet-hardware@100m", "tcp_n2p_gbps", 1},
		{1, "usernet-hardware", "tcp_n2p_gbps", 10},
	}}
	cells := b.cells()
	for _, c := range []struct {
		row  string
		want float64
	}{{"usernet-hardware@100m", 0.25}, {"usernet-hardware", 0.5}, {"kernel@100m", 1}} {
		if r := cells[c.row]["tcp_n2p_gbps"].Ratio; r == nil || *r != c.want {
			t.Errorf("%s: got ratio %v, want %v", c.row, r, c.want)
		}
	}
	if cfg, l, ok := limitOf("usernet-hardware@0.5"); !ok || cfg != "usernet-hardware" || l != "0.5" {
		t.Errorf("limitOf: got %q %q %v, want usernet-hardware 0.5 true", cfg, l, ok)
	}
}

func TestParseStatusRSS(t *testing.T) {
	got, err := parseStatusRSS([]byte("Name:\tcni-usernet-st\nVmRSS:\t   14404 kB\nRssAnon:\t    3020 kB\nRssFile:\t   11384 kB\nRssShmem:\t       0 kB\n"))
	if want := (rss{14404 * 1024, 3020 * 1024, 11384 * 1024}); err != nil || got != want {
		t.Errorf("got %+v, %v; want %+v, nil", got, err, want)
	}
	if _, err := parseStatusRSS([]byte("VmRSS:\t1 kB\n")); err == nil {
		t.Error("got no error without RssAnon and RssFile")
	}
}
