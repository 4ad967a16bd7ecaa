package attack

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func (r *runner) links() {
	links, err := listLinks()
	if err != nil {
		r.emit(Outcome{Attack: Links, Case: "list", Err: err.Error()})
		return
	}
	for _, l := range links {
		o := Outcome{Attack: Links, Case: l.Name, Link: l.Name, Sent: true, Detail: l.String()}
		if !l.loopback() && !l.tun() {
			o.Reached = []string{fmt.Sprintf("sees %s: a link to the wire, whose every frame a packet socket reads and writes", l)}
		}
		r.emit(o)
	}
}

// newLink creates links of its own and sends a datagram to the victim
// through each: a veth pair (nowhere to go unless one end leaves the
// namespace), and a macvlan and an ipvlan on every link the pod sees
// (straight onto that link's wire, with the link-layer address of their
// own).
func (r *runner) newLink() {
	links, err := listLinks()
	if err != nil {
		r.emit(Outcome{Attack: NewLink, Case: "list", Err: err.Error()})
		return
	}
	// The node's link-layer address, learnt on the links the pod has: a
	// link stacked on one of them may not hear the answer to its own ARP
	// (the stack's ingress drop sits on the lower link, before macvlan's
	// receive), yet sends to the same node.
	gws := map[int]net.HardwareAddr{}
	for _, l := range links {
		if !l.ethernet() || l.loopback() {
			continue
		}
		if s, err := openLinkSock(l); err == nil {
			s.resolve(r.s.Self, r.s.NodeAddr)
			gws[l.Index] = s.gw
			s.Close()
		}
	}
	p := r.prefix()
	type made struct {
		how  string
		link netlink.Link
	}
	var tries []made
	tries = append(tries, made{"veth", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p + "v0"}, PeerName: p + "v1"}})
	for _, l := range links {
		if l.loopback() {
			continue
		}
		tries = append(tries,
			made{"macvlan-on-" + l.Name, &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("%smv%d", p, l.Index), ParentIndex: l.Index},
				Mode: netlink.MACVLAN_MODE_BRIDGE}},
			made{"ipvlan-on-" + l.Name, &netlink.IPVlan{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("%siv%d", p, l.Index), ParentIndex: l.Index},
				Mode: netlink.IPVLAN_MODE_L2}},
		)
	}
	ts := targets(r.s.Self, r.s.Victim, r.s.VictimUDP, 0)
	b := newBatch()
	r.batches = append(r.batches, b)
	for _, m := range tries {
		if err := netlink.LinkAdd(m.link); err != nil {
			r.emit(Outcome{Attack: NewLink, Case: m.how, Err: fmt.Sprintf("creating %s: %v", m.link.Attrs().Name, err)})
			continue
		}
		b.closers = append(b.closers, func() { netlink.LinkDel(m.link) })
		l, s, err := upAndOpen(m.link.Attrs().Name)
		if v, ok := m.link.(*netlink.Veth); ok && err == nil {
			if peer, perr := netlink.LinkByName(v.PeerName); perr == nil {
				netlink.LinkSetUp(peer)
			}
		}
		if err != nil {
			r.emit(Outcome{Attack: NewLink, Case: m.how, Sent: true, Err: err.Error(), Detail: "created " + m.link.Attrs().Name})
			continue
		}
		// Closed before the link goes (closers run in order).
		b.closers = slices.Insert(b.closers, 0, s.Close)
		s.resolve(r.s.Self, r.s.NodeAddr)
		if gw, ok := gws[m.link.Attrs().ParentIndex]; ok && slices.Equal(s.gw, Broadcast) {
			s.gw = gw
		}
		for _, t := range ts {
			t := r.fresh(t)
			o := Outcome{Attack: NewLink, Case: m.how + "/" + t.name, Link: l.Name, Src: t.src, Dst: t.dst,
				Detail: fmt.Sprintf("created %s, sent to %s", l, s.gw)}
			o.Marker = r.marker(NewLink, o.Case)
			if err := s.send(t.packet([]byte(o.Marker))); err != nil {
				o.Err = err.Error()
			} else {
				o.Sent = true
			}
			b.add(o, s, t)
		}
	}
}

// upAndOpen brings a link up and opens a packet socket on it.
func upAndOpen(name string) (link, *linkSock, error) {
	nlink, err := netlink.LinkByName(name)
	if err != nil {
		return link{}, nil, err
	}
	if err := netlink.LinkSetUp(nlink); err != nil {
		return link{}, nil, fmt.Errorf("bringing %s up: %w", name, err)
	}
	links, err := listLinks()
	if err != nil {
		return link{}, nil, err
	}
	i := slices.IndexFunc(links, func(l link) bool { return l.Name == name })
	if i < 0 {
		return link{}, nil, fmt.Errorf("%s is gone", name)
	}
	s, err := openLinkSock(links[i])
	return links[i], s, err
}

// move creates a link and tries to put it into every other network
// namespace it can name. A link that leaves is removed where it went (the
// test that runs this owns every namespace a confined pod could name; run
// unconfined on a host, it would name the host's).
func (r *runner) move() {
	name := r.prefix() + "d0"
	mk := func() (netlink.Link, error) { return addPlainLink(name, movableKinds) }
	l, err := mk()
	if err != nil {
		r.emit(Outcome{Attack: Move, Case: "create", Err: fmt.Sprintf("creating %s: %v", name, err)})
		return
	}
	defer func() {
		if l, err := netlink.LinkByName(name); err == nil {
			netlink.LinkDel(l)
		}
	}()
	own := nsInode("/proc/self/ns/net")
	// A way names the target namespace's file (to remove the link there
	// if it went) and moves the link.
	type way struct {
		how, file string
		move      func(netlink.Link) error
	}
	ways := []way{{"pid/1", "/proc/1/ns/net", func(l netlink.Link) error { return netlink.LinkSetNsPid(l, 1) }}}
	byFile := func(path string) way {
		return way{"file" + path, path, func(l netlink.Link) error {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			return netlink.LinkSetNsFd(l, int(f.Fd()))
		}}
	}
	// Every process it sees, by pid and by its namespace file, where that
	// is another namespace than its own.
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		if ino := nsInode(p); ino == 0 || ino == own {
			continue
		}
		pid, _ := strconv.Atoi(strings.Split(p, "/")[2])
		if pid != 1 {
			ways = append(ways, way{"pid/" + strconv.Itoa(pid), p, func(l netlink.Link) error { return netlink.LinkSetNsPid(l, pid) }})
		}
		ways = append(ways, byFile(p))
	}
	// Where runtimes and ip-netns pin namespaces.
	for _, dir := range []string{"/run/netns", "/var/run/netns", "/run/docker/netns", "/var/run/docker/netns"} {
		files, _ := os.ReadDir(dir)
		for _, f := range files {
			ways = append(ways, byFile(filepath.Join(dir, f.Name())))
		}
	}
	for _, w := range ways {
		o := Outcome{Attack: Move, Case: w.how, Link: name, Detail: fmt.Sprintf("a %s link", l.Type())}
		if err := w.move(l); err != nil {
			o.Err = err.Error()
		} else {
			o.Sent = true
			if _, err := netlink.LinkByName(name); err != nil {
				o.Reached = []string{fmt.Sprintf("moved %s out of the pod's namespace by %s", name, w.how)}
				if err := removeFrom(w.file, name); err != nil {
					o.Detail += fmt.Sprintf("; left there: %v", err)
				}
				if l, err = mk(); err != nil {
					r.emit(o)
					r.emit(Outcome{Attack: Move, Case: "create", Err: fmt.Sprintf("creating %s again: %v", name, err)})
					return
				}
			} else {
				o.Detail += "; it stayed: the same namespace"
			}
		}
		r.emit(o)
	}
}

// removeFrom deletes the link name in the namespace of the file, through
// the id the caller's namespace has (or gets) for it.
func removeFrom(file, name string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	id, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	if err != nil || id < 0 {
		if err := netlink.SetNetNsIdByFd(int(f.Fd()), -1); err != nil {
			return fmt.Errorf("naming the namespace: %w", err)
		}
		if id, err = netlink.GetNetNsIdByFd(int(f.Fd())); err != nil {
			return err
		}
	}
	return linkIn(unix.RTM_DELLINK, 0, id, name, "")
}

// Link kinds that need nothing but a name, in the order they are tried:
// kernels are built with some and not others. A bridge cannot change
// namespaces (NETIF_F_NETNS_LOCAL): not one to move.
var (
	plainKinds   = []string{"dummy", "ifb", "bridge"}
	movableKinds = []string{"dummy", "ifb"}
)

// addPlainLink creates a link of the first of the kinds the kernel has.
func addPlainLink(name string, kinds []string) (netlink.Link, error) {
	var err error
	for _, kind := range kinds {
		attrs := netlink.LinkAttrs{Name: name}
		var l netlink.Link
		switch kind {
		case "dummy":
			l = &netlink.Dummy{LinkAttrs: attrs}
		case "bridge":
			l = &netlink.Bridge{LinkAttrs: attrs}
		case "ifb":
			l = &netlink.Ifb{LinkAttrs: attrs}
		}
		if err = netlink.LinkAdd(l); err == nil || errors.Is(err, unix.EEXIST) {
			return netlink.LinkByName(name)
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return nil, err
		}
	}
	return nil, err
}

func nsInode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

// foreign lists the ids the pod's namespace gives other namespaces (a
// veth's peer's gets one as soon as links are listed) and, through each,
// the links of that namespace; with ForeignWrites, creates and removes a
// dummy link there.
func (r *runner) foreign() {
	listLinks() // gives the peers' namespaces their ids, as any `ip link` would
	ids, err := netnsIDs()
	o := Outcome{Attack: Foreign, Case: "ids"}
	if err != nil {
		o.Err = err.Error()
		r.emit(o)
		return
	}
	o.Sent, o.Detail = true, fmt.Sprintf("the pod's namespace names %d others: %v", len(ids), ids)
	r.emit(o)
	for _, id := range ids {
		o := Outcome{Attack: Foreign, Case: fmt.Sprintf("nsid%d/list", id)}
		names, err := linksIn(id)
		if err != nil {
			o.Err = err.Error()
		} else {
			o.Sent = true
			o.Reached = []string{fmt.Sprintf("listed the links of namespace id %d: %s", id, strings.Join(names, ", "))}
		}
		r.emit(o)
		if !r.s.ForeignWrites {
			continue
		}
		name := fmt.Sprintf("%sfx%d", r.prefix(), id)
		o = Outcome{Attack: Foreign, Case: fmt.Sprintf("nsid%d/create", id), Link: name}
		for _, kind := range plainKinds {
			if err = linkIn(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, id, name, kind); !errors.Is(err, unix.EOPNOTSUPP) {
				break
			}
		}
		if err != nil {
			o.Err = err.Error()
		} else {
			o.Sent = true
			o.Reached = []string{fmt.Sprintf("created link %s in namespace id %d", name, id)}
			if err := linkIn(unix.RTM_DELLINK, 0, id, name, ""); err != nil {
				o.Detail = "and could not remove it: " + err.Error()
			}
		}
		r.emit(o)
	}
}

// netnsIDs dumps the ids the calling thread's namespace has for others.
func netnsIDs() ([]int, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNSID, unix.NLM_F_DUMP)
	req.AddData(nl.NewRtGenMsg())
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNSID)
	if err != nil {
		return nil, fmt.Errorf("dumping namespace ids: %w", err)
	}
	var ids []int
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[nl.NewRtGenMsg().Len():])
		if err != nil {
			return nil, err
		}
		for _, a := range attrs {
			if a.Attr.Type == netlink.NETNSA_NSID && len(a.Value) >= 4 {
				if id := int(int32(nl.NativeEndian().Uint32(a.Value))); id >= 0 {
					ids = append(ids, id)
				}
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// linksIn lists the links of the namespace with the id, through
// IFLA_TARGET_NETNSID (CAP_NET_ADMIN over that namespace).
func linksIn(id int) ([]string, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(id))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return nil, fmt.Errorf("listing the links of namespace id %d: %w", id, err)
	}
	var names []string
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return nil, err
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.IFLA_IFNAME {
				names = append(names, strings.TrimRight(string(a.Value), "\x00"))
			}
		}
	}
	return names, nil
}

// linkIn creates (RTM_NEWLINK, of kind) or deletes (RTM_DELLINK) the
// link name in the namespace with the id.
func linkIn(op, flags, id int, name, kind string) error {
	req := nl.NewNetlinkRequest(op, unix.NLM_F_ACK|flags)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(id))))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if kind != "" {
		info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
		info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated(kind))
		req.AddData(info)
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// tun tries to attach to every TUN the pod sees, single- and multi-queue:
// an attached queue reads what the kernel routes into the TUN for the
// stack.
func (r *runner) tun() {
	links, err := listLinks()
	if err != nil {
		r.emit(Outcome{Attack: TUN, Case: "list", Err: err.Error()})
		return
	}
	for _, l := range links {
		if !l.tun() {
			continue
		}
		for _, q := range []struct {
			name  string
			flags uint16
		}{{"single", unix.IFF_TUN | unix.IFF_NO_PI}, {"multi", unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE}} {
			o := Outcome{Attack: TUN, Case: l.Name + "/" + q.name + "-queue", Link: l.Name}
			if err := attachTUN(l.Name, q.flags); err != nil {
				o.Err = err.Error()
				if errors.Is(err, unix.EBUSY) {
					// The kernel checked ownership and capabilities
					// before it found the one queue taken.
					o.Detail = "busy: its one queue is the stack's; a TUN without an owner would take this process while the stack is not attached"
				}
			} else {
				o.Sent = true
				o.Reached = []string{fmt.Sprintf("attached a %s queue to %s", q.name, l.Name)}
			}
			r.emit(o)
		}
	}
}

func attachTUN(name string, flags uint16) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("attaching to %s: %w", name, err)
	}
	return nil
}
