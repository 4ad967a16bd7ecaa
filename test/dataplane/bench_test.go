package dataplane

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// BenchmarkBulk moves b.N MiB through a pod's stack in each direction and
// GSO mode, reporting throughput and the stack's CPU per GB, so that a
// regression shows in a benchstat diff:
//
//	go test -run '^$' -bench Bulk -count 5 ./test/dataplane | tee new.txt
func BenchmarkBulk(b *testing.B) {
	for _, mode := range []string{"hardware", "software", "off"} {
		for _, dir := range []string{"node→pod", "pod→node"} {
			b.Run(fmt.Sprintf("%s/%s", mode, dir), func(b *testing.B) {
				env := nettest.NewEnv(b)
				pod := env.NewPod(env.Conf(cniVersion, map[string]any{"gso": mode}))
				st := stackStatusB(b, env, pod)
				srvNS, cliNS, addr := pod.NS, env.Node, pod.IP(4)
				if dir == "pod→node" {
					srvNS, cliNS, addr = env.Node, pod.NS, pod.Gateway(4)
				}
				ln := nettest.Listen(b, srvNS, "tcp", nettest.HostPort(addr, 5201))
				go func() {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					io.Copy(io.Discard, c)
					c.Close()
				}()
				c, err := nettest.Dial(cliNS, "tcp", nettest.HostPort(addr, 5201), 5*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				block := make([]byte, 1<<20)
				b.SetBytes(int64(len(block)))
				b.ReportAllocs()
				cpu0 := nettest.StackCPU(st.PID)
				start := time.Now()
				for b.Loop() {
					if _, err := c.Write(block); err != nil {
						b.Fatal(err)
					}
				}
				elapsed := time.Since(start)
				c.(*net.TCPConn).CloseWrite()
				bytes := float64(b.N) * float64(len(block))
				b.ReportMetric(bytes*8/elapsed.Seconds()/1e9, "Gbit/s")
				b.ReportMetric((nettest.StackCPU(st.PID)-cpu0).Seconds()/(bytes/1e9), "stack-cpu-s/GB")
			})
		}
	}
}
