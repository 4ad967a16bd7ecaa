package capabilities

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// serveName answers every TCP connection on port and every UDP datagram
// on udpPort (0: none) in the pod with "NAME PEER", the peer address the
// pod's application saw.
func serveName(t *testing.T, p *pod, name string, port, udpPort int) {
	t.Helper()
	if port != 0 {
		ln := nettest.Listen(t, p.netns, "tcp", fmt.Sprintf(":%d", port))
		nettest.Serve(ln, func(c net.Conn) { fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr()) })
	}
	if udpPort != 0 {
		c := nettest.ListenUDP(t, p.netns, fmt.Sprintf(":%d", udpPort))
		go func() {
			buf := make([]byte, 1500)
			for {
				_, from, err := c.ReadFromUDP(buf)
				if err != nil {
					return
				}
				c.WriteToUDP([]byte(fmt.Sprintf("%s %s\n", name, from)), from)
			}
		}()
	}
}

// ask connects from netns to addr over network (tcp, udp) and returns the
// answer's two words: the pod's name and the peer it saw.
func ask(netns ns.NetNS, network, addr string) (name, peer string, err error) {
	for attempt := 0; attempt < 3; attempt++ {
		var c net.Conn
		c, err = nettest.Dial(netns, network, addr, 3*time.Second)
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if network == "udp" {
			c.Write([]byte("who"))
		}
		var line string
		line, err = bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return "", "", fmt.Errorf("answer %q", line)
		}
		host, _, _ := net.SplitHostPort(f[1])
		return f[0], host, nil
	}
	return "", "", err
}

// TestHostPort: portmap chained after cni-usernet maps a pod's hostPort
// from the node's addresses to the pod's stack, from another node (the
// client's address preserved) and from the node itself (its own address
// and 127.0.0.1); two pods share a hostPort on different hostIPs, and
// another with different protocols; DEL takes only the deleted pod's
// mappings away. Standalone pods are dual-stack, and their hostPorts
// answer on the node's IPv6 address too; chained behind ptp, IPv4.
func TestHostPort(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("portmap's iptables backend needs iptables")
	}
	t.Run("standalone", func(t *testing.T) { testHostPort(t, labOptions{IPv6: true}) })
	t.Run("chained", func(t *testing.T) { testHostPort(t, labOptions{Chained: true}) })
}

func testHostPort(t *testing.T, o labOptions) {
	l := newLab(t, o)
	a := l.add("web-a", map[string]any{"portMappings": []map[string]any{
		{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": nodeIP},
		{"hostPort": 9090, "containerPort": 90, "protocol": "tcp"},
	}})
	b := l.add("web-b", map[string]any{"portMappings": []map[string]any{
		{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": nodeIP2},
		{"hostPort": 9090, "containerPort": 90, "protocol": "udp"},
	}})
	serveName(t, a, "web-a", 80, 0)
	serveName(t, a, "web-a", 90, 0)
	serveName(t, b, "web-b", 80, 90)

	type probe struct {
		from          string
		network, addr string
		want, peer    string // peer "": not checked (masqueraded)
	}
	probes := []probe{
		{"other", "tcp", nodeIP + ":8080", "web-a", otherIP},
		{"other", "tcp", nodeIP2 + ":8080", "web-b", otherIP2},
		{"other", "tcp", nodeIP + ":9090", "web-a", otherIP},
		{"other", "udp", nodeIP + ":9090", "web-b", otherIP},
		{"node", "tcp", nodeIP + ":8080", "web-a", nodeIP},
		{"node", "tcp", nodeIP2 + ":8080", "web-b", nodeIP2},
		{"node", "tcp", nodeIP2 + ":9090", "web-a", nodeIP2},
		{"node", "udp", nodeIP + ":9090", "web-b", nodeIP},
		{"node", "tcp", "127.0.0.1:9090", "web-a", ""},
	}
	if o.IPv6 {
		probes = append(probes,
			probe{"other", "tcp", "[" + nodeIP6 + "]:9090", "web-a", otherIP6},
			probe{"other", "udp", "[" + nodeIP6 + "]:9090", "web-b", otherIP6},
			probe{"node", "tcp", "[" + nodeIP6 + "]:9090", "web-a", nodeIP6})
	}
	from := map[string]ns.NetNS{"other": l.other, "node": l.env.Node}
	run := func(probes []probe) {
		t.Helper()
		for _, p := range probes {
			name, peer, err := ask(from[p.from], p.network, p.addr)
			switch {
			case err != nil:
				t.Errorf("from %s, %s %s: %v, want %s", p.from, p.network, p.addr, err, p.want)
			case name != p.want:
				t.Errorf("from %s, %s %s: answered by %s, want %s", p.from, p.network, p.addr, name, p.want)
			case p.peer != "" && peer != p.peer:
				t.Errorf("from %s, %s %s: %s saw %s, want %s", p.from, p.network, p.addr, name, peer, p.peer)
			}
		}
	}
	run(probes)
	if err := l.check(a); err != nil {
		t.Errorf("CHECK web-a: %v", err)
	}

	if err := l.del(a); err != nil {
		t.Fatalf("DEL web-a: %v", err)
	}
	if _, _, err := ask(l.other, "tcp", nodeIP+":8080"); err == nil {
		t.Errorf("web-a deleted: %s:8080 still answers", nodeIP)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nat, err := nsExec(ctx, l.env.Node, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatalf("iptables-save: %v\n%s", err, nat)
	}
	if strings.Contains(nat, a.id) {
		t.Errorf("web-a deleted: its rules are left:\n%s", nat)
	}
	if !strings.Contains(nat, b.id) {
		t.Errorf("web-b's rules are gone with web-a's:\n%s", nat)
	}
	run([]probe{
		{"other", "tcp", nodeIP2 + ":8080", "web-b", otherIP2},
		{"other", "udp", nodeIP + ":9090", "web-b", otherIP},
	})
}
