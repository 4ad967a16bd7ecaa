package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// The "cni" role runs libcni inside the node namespace. It is started as
// `nsenter --net=/var/run/netns/ub-node bench cni ...`, so the plugins it executes, and the
// veth host sides they create, live in the node namespace, never in the
// root one.

// addBenchResult is what `cni addbench` prints.
type addBenchResult struct {
	AddMS  []float64 `json:"addMs"`
	DelMS  []float64 `json:"delMs"`
	Errors []string  `json:"errors,omitempty"`
}

func cniMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: bench cni add|del|addbench [flags]")
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("cni "+verb, flag.ContinueOnError)
	bin := fs.String("bin", "", "plugin directory")
	cache := fs.String("cache", "", "libcni cache directory")
	conf := fs.String("conf", "", "conflist file")
	id := fs.String("id", "", "container ID (add, del)")
	pod := fs.String("pod", "", "add: the pod's namespace/name, passed as K8S_POD_NAMESPACE and K8S_POD_NAME (a conflist with networkPolicy needs them)")
	netns := fs.String("netns", "", "network namespace path (add, del)")
	prefix := fs.String("netns-prefix", "", "addbench, addmany, delmany: namespace paths are <prefix><i>")
	idPrefix := fs.String("id-prefix", "ub-add-", "addbench, addmany, delmany: container IDs are <id-prefix><i>")
	podUID := fs.String("pod-uid", "", "add: the pod's UID, passed as K8S_POD_UID: the plugin charges the stack to the cgroup kubelet would have made for it")
	n := fs.Int("n", 0, "addbench: pods")
	par := fs.Int("parallel", 1, "addbench: concurrent ADDs")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	raw, err := os.ReadFile(*conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parsing conflist:", err)
		return 1
	}
	cn := libcni.NewCNIConfigWithCacheDir([]string{*bin}, *cache, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	switch verb {
	case "add":
		rt := &libcni.RuntimeConf{ContainerID: *id, NetNS: *netns, IfName: "eth0"}
		if ns, name, ok := strings.Cut(*pod, "/"); ok {
			rt.Args = [][2]string{{"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", name}}
		}
		if *podUID != "" {
			rt.Args = append(rt.Args, [2]string{"K8S_POD_UID", *podUID})
		}
		if len(rt.Args) > 0 {
			rt.Args = append([][2]string{{"IgnoreUnknown", "1"}}, rt.Args...)
		}
		res, err := cn.AddNetworkList(ctx, list, rt)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ADD:", err)
			return 1
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			fmt.Fprintln(os.Stderr, "converting the result:", err)
			return 1
		}
		if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
			return 1
		}
	case "del":
		if err := cn.DelNetworkList(ctx, list, &libcni.RuntimeConf{ContainerID: *id, NetNS: *netns, IfName: "eth0"}); err != nil {
			fmt.Fprintln(os.Stderr, "DEL:", err)
			return 1
		}
	case "addbench", "addmany", "delmany":
		res := addBench(ctx, cn, list, *prefix, *idPrefix, *n, *par, verb != "delmany", verb != "addmany")
		if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
			return 1
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown cni verb", verb)
		return 2
	}
	return 0
}

// addBench attaches n pods, par at a time, timing each ADD, then detaches
// them all the same way, timing each DEL. Every pod is detached, also when
// its ADD failed (DEL must clean up a partial ADD). With add or del false
// that half is left out (addmany, delmany: the scale section holds the
// pods between the two). AddMS is in the order the ADDs finished.
func addBench(ctx context.Context, cn *libcni.CNIConfig, list *libcni.NetworkConfigList, prefix, idPrefix string, n, par int, add, del bool) addBenchResult {
	var (
		mu  sync.Mutex
		res addBenchResult
	)
	each := func(verb string, do func(rt *libcni.RuntimeConf) error, into *[]float64) {
		sem := make(chan struct{}, par)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("%s%d", idPrefix, i), NetNS: fmt.Sprintf("%s%d", prefix, i), IfName: "eth0"}
				start := time.Now()
				err := do(rt)
				ms := float64(time.Since(start).Microseconds()) / 1000
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					res.Errors = append(res.Errors, fmt.Sprintf("%s %s: %v", verb, rt.ContainerID, err))
					return
				}
				*into = append(*into, ms)
			}()
		}
		wg.Wait()
	}
	if add {
		each("ADD", func(rt *libcni.RuntimeConf) error { _, err := cn.AddNetworkList(ctx, list, rt); return err }, &res.AddMS)
	}
	if del {
		each("DEL", func(rt *libcni.RuntimeConf) error { return cn.DelNetworkList(ctx, list, rt) }, &res.DelMS)
	}
	return res
}
