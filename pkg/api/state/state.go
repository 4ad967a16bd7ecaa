// Package state keeps one file per attachment (container ID + interface)
// recording what ADD did, so that DEL, CHECK, GC and the status command can
// find, verify and undo it.
package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// Version is the state file format. A file of another version is reported,
// never guessed at.
const Version = 1

// Attachment is what ADD did for one container interface.
type Attachment struct {
	Version     int    `json:"version"`
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
	// WireNetns is the pinned network namespace of the stack's own that
	// holds the pod's link to the node (pkg/node/wirens); empty for an
	// attachment made when that link still sat in the pod's namespace.
	WireNetns string `json:"wireNetns,omitempty"`
	// SourceGuard is the node-side link of the pod's veth that only
	// frames with the pod's MAC and addresses may enter from
	// (pkg/node/sourceguard); empty: none (an earlier release, or a chained
	// interface that is no veth).
	SourceGuard string    `json:"sourceGuard,omitempty"`
	PodNS       string    `json:"podNamespace,omitempty"`
	PodName     string    `json:"podName,omitempty"`
	Created     time.Time `json:"created"`
	// Chained is true when an earlier plugin made the interface; DEL then
	// leaves the link and the IP lease to that plugin.
	Chained  bool   `json:"chained"`
	HostVeth string `json:"hostVeth,omitempty"`
	// IPAMType and IPAMConf let DEL and GC release the lease even when the
	// caller's configuration has changed since ADD.
	IPAMType string          `json:"ipamType,omitempty"`
	IPAMConf json.RawMessage `json:"ipamConf,omitempty"`
	IPs      []string        `json:"ips"`
	Result   json.RawMessage `json:"result,omitempty"`
	// The stack process. StartTime is the kernel's start time of the
	// process (clock ticks since boot, /proc/PID/stat field 22), so that a
	// reused PID is never mistaken for the stack.
	StackPID       int    `json:"stackPID"`
	StackStartTime uint64 `json:"stackStartTime"`
	ConfigPath     string `json:"configPath"`
	SpecPath       string `json:"specPath"`
	ControlSocket  string `json:"controlSocket"`
	LogPath        string `json:"logPath"`
	// PolicyPath is the pod's compiled network policy, which the node
	// agent writes and the stack reads at start; empty in records made
	// before it was named here (the file is beside ConfigPath).
	PolicyPath string           `json:"policyPath,omitempty"`
	GSO        offload.Decision `json:"gso"`
	// StackBinary is the executable the stack was started from, and
	// StackCgroups its /proc/PID/cgroup lines at start: a supervisor
	// restarts the stack from the same binary into the same cgroups (the
	// pod's, or the runtime's), never into its own.
	StackBinary  string   `json:"stackBinary,omitempty"`
	StackCgroups []string `json:"stackCgroups,omitempty"`
	// Supervision is written by the node agent when it restarts the stack.
	Supervision *Supervision `json:"supervision,omitempty"`
	// SocketRedirect is the pod's socket redirect (pkg/node/sockmap);
	// nil in records made before it.
	SocketRedirect *SocketRedirect `json:"socketRedirect,omitempty"`
}

// SocketRedirect says whether the messages of the pod's loopback TCP
// connections go from socket to socket in the kernel, and where DEL and
// the commands find the node's programs for it.
type SocketRedirect struct {
	On bool `json:"on"`
	// Both: the stack's writes to the applications are redirected too.
	Both bool `json:"both,omitempty"`
	// Direct: connections with another direct pod of the node go from
	// application socket to application socket.
	Direct bool `json:"direct,omitempty"`
	// Services: connections to the pod through a Service's cluster IP
	// join too (the node's translation is read on its link); when a
	// direct pod's cannot, ServicesOff says why.
	Services    bool   `json:"services,omitempty"`
	ServicesOff string `json:"servicesOff,omitempty"`
	// Reason says what decided: the annotation or the conflist, or why
	// the kernel could not.
	Reason string `json:"reason,omitempty"`
	// BPFDir is where the node's programs are pinned; NetnsCookie is the
	// pod namespace's cookie, the programs' key for the pod.
	BPFDir      string `json:"bpfDir,omitempty"`
	NetnsCookie uint64 `json:"netnsCookie,omitempty"`
}

// Supervision is the node agent's record of the stack's crashes.
type Supervision struct {
	// Restarts counts restarts since ADD; Crashes counts consecutive quick
	// deaths (a stack that ran long enough resets it).
	Restarts int `json:"restarts"`
	Crashes  int `json:"crashes"`
	// LastExit is when the agent saw the stack gone, LastReason what it
	// knows of why (the last line of the stack's log).
	LastExit   time.Time `json:"lastExit,omitzero"`
	LastReason string    `json:"lastReason,omitempty"`
	// NextRestart is when the agent will try again while backing off.
	NextRestart time.Time `json:"nextRestart,omitzero"`
	// Unhealthy, when set, says why the attachment is reported unhealthy
	// (CHECK fails with it, status shows it): a crash loop, or a restart
	// that fails.
	Unhealthy string `json:"unhealthy,omitempty"`
}

// Store is a directory of attachment files.
type Store struct{ Dir string }

// ErrNotFound is returned by Load when no file exists.
var ErrNotFound = errors.New("attachment state not found")

const suffix = ".json"

// Key names an attachment's files: short enough for a unix socket path,
// unique per container and interface.
func Key(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return hex.EncodeToString(sum[:8])
}

func (s Store) path(containerID, ifName string) string {
	return filepath.Join(s.Dir, Key(containerID, ifName)+suffix)
}

// Writable checks that the store can take a new file (STATUS uses it).
func (s Store) Writable() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("creating state directory %s: %w", s.Dir, err)
	}
	f, err := os.CreateTemp(s.Dir, ".probe*")
	if err != nil {
		return fmt.Errorf("state directory %s is not writable: %w", s.Dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// Save writes a atomically.
func (s Store) Save(a *Attachment) error {
	a.Version = Version
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("creating state directory %s: %w", s.Dir, err)
	}
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(a.ContainerID, a.IfName), b, 0o600); err != nil {
		return fmt.Errorf("saving state of %s/%s: %w", a.ContainerID, a.IfName, err)
	}
	return nil
}

// Load reads the attachment; ErrNotFound when there is none.
func (s Store) Load(containerID, ifName string) (*Attachment, error) {
	return s.read(s.path(containerID, ifName))
}

func (s Store) read(p string) (*Attachment, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading state %s: %w", p, err)
	}
	var a Attachment
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("state file %s is corrupt: %w", p, err)
	}
	if a.Version != Version {
		return nil, fmt.Errorf("state file %s has version %d, this cni-usernet reads %d", p, a.Version, Version)
	}
	if a.ContainerID == "" || a.IfName == "" {
		return nil, fmt.Errorf("state file %s names no container and interface: not an attachment", p)
	}
	return &a, nil
}

// Delete removes the attachment's file; already gone is success.
func (s Store) Delete(containerID, ifName string) error {
	if err := os.Remove(s.path(containerID, ifName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing state of %s/%s: %w", containerID, ifName, err)
	}
	return nil
}

// List reads every attachment. Files that cannot be read are returned as
// errors beside the ones that can, so one bad file hides nothing else.
func (s Store) List() ([]*Attachment, []error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("listing %s: %w", s.Dir, err)}
	}
	var out []*Attachment
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), suffix) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		a, err := s.read(filepath.Join(s.Dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, a)
	}
	return out, errs
}
