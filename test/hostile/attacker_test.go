package hostile

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/test/lib/attack"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// attackerEnv carries an attack.Spec (JSON) to the test binary started as
// a hostile pod's process: TestMain runs the attacks instead of the tests.
const attackerEnv = "CNI_USERNET_ATTACKER_SPEC"

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(attackerEnv); ok {
		os.Exit(runAttacker(spec))
	}
	os.Exit(m.Run())
}

// runAttacker runs the spec's attacks and prints each outcome on its own
// line as it comes.
func runAttacker(spec string) int {
	var s attack.Spec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintf(os.Stderr, "attacker: reading the spec: %v\n", err)
		return 2
	}
	if err := attack.Run(s, func(o attack.Outcome) { os.Stdout.Write(attack.Encode(o)) }); err != nil {
		fmt.Fprintf(os.Stderr, "attacker: %v\n", err)
		return 2
	}
	return 0
}

// containerCaps are the capabilities containerd gives a container unless
// its spec says otherwise (oci.WithDefaultUnixCaps, Docker's list), which
// a pod without a securityContext keeps: CAP_NET_RAW among them.
var containerCaps = []string{"chown", "dac_override", "fsetid", "fowner", "mknod", "net_raw", "setgid", "setuid",
	"setfcap", "setpcap", "net_bind_service", "sys_chroot", "kill", "audit_write"}

// confinement is how the attacker runs: as root in the pod's network
// namespace, like a container's process.
type confinement struct {
	// caps are its only capabilities (bounding, permitted and effective).
	caps []string
	// hide are directories covered with an empty tmpfs in its mount
	// namespace: the node's /run (namespace pins) and /var/lib, and the
	// env's directory (the stacks' state, sockets and pins).
	hide []string
}

// attackerScript runs in the new pid and mount namespaces (unshare): it
// covers the directories given as arguments, then drops to the
// capabilities in $CAPS, as a runtime does before it runs the container's
// process, and becomes that process.
const attackerScript = `set -e
for d in "$@"; do mount -t tmpfs -o size=1m,mode=755 cni-usernet-attacker "$d"; done
exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set="-all,$CAPS" -- "$ATTACKER"`

// runAttack starts the test binary as an attacker in the pod's network
// namespace (started from a thread switched into it, as pkg/node/launch starts
// a stack), in a pid and mount namespace of its own, with c's
// capabilities, runs spec, hands each outcome to each as it arrives (nil:
// none) and returns them all once the attacker exited.
func runAttack(t *testing.T, pod ns.NetNS, c confinement, spec attack.Spec, each func(attack.Outcome)) []attack.Outcome {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var caps []string
	for _, c := range c.caps {
		caps = append(caps, "+"+c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// --kill-child: the attacker dies with unshare, which the context
	// kills on a timeout.
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--pid", "--fork", "--kill-child", "--mount", "--propagation", "private",
		"--mount-proc", "--", "/bin/sh", "-c", attackerScript, "attacker"}, c.hide...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE"),
		attackerEnv + "=" + string(b), "CAPS=" + strings.Join(caps, ","), "ATTACKER=" + self}
	var stderr nettest.LockedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := nettest.In(pod, cmd.Start); err != nil {
		t.Fatalf("starting the attacker: %v", err)
	}
	var all []attack.Outcome
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		outcomes, other := attack.Decode(sc.Bytes())
		for _, line := range other {
			t.Logf("attacker: %s", line)
		}
		for _, o := range outcomes {
			all = append(all, o)
			if each != nil {
				each(o)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("attacker (%v): %v\n%s", spec.Attacks, err, stderr.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("attacker's stderr: %s", s)
	}
	return all
}
