package policy

import (
	"errors"
	"net/netip"
	"strconv"
	"time"
)

// Flow is a new connection or flow a verdict is taken on.
type Flow struct {
	Dir Dir
	// Proto is the IP protocol number (ProtoTCP, ...).
	Proto uint8
	// Peer is the other end: the source of ingress, the destination of
	// egress.
	Peer netip.Addr
	// Port is the pod's port for ingress, the peer's for egress; 0 for a
	// protocol without ports.
	Port uint16
	// Local is the pod's address; zero when the verdict site does not
	// know it.
	Local netip.Addr
}

// Reason says why a flow was denied. A denial is never one rule's doing:
// rules only allow, so what decides is that none of the isolating
// policies' rules admits the flow (NoRuleAdmits), or that it cannot be
// judged at all.
type Reason uint8

const (
	// NoRuleAdmits: the direction is isolated and no rule of the
	// policies that isolate it allows the peer, protocol and port.
	NoRuleAdmits Reason = iota
	// NoAllowedBackend: the destination is a Service whose backends the
	// egress rules all deny.
	NoAllowedBackend
	// TinyFragment: a first fragment too short to carry the ports
	// (RFC 1858), which the verdict needs.
	TinyFragment
	// TooManyHeaders: an IPv6 packet with more extension headers than the
	// verdict walks to find its transport header.
	TooManyHeaders
	// AdminDeny: a Deny rule of an Admin tier ClusterNetworkPolicy
	// matched first.
	AdminDeny
	// BaselineDeny: no NetworkPolicy isolates the direction and a Deny
	// rule of a Baseline tier ClusterNetworkPolicy matched first.
	BaselineDeny
)

func (r Reason) String() string {
	switch r {
	case NoRuleAdmits:
		return "no rule admits"
	case NoAllowedBackend:
		return "no allowed backend"
	case TinyFragment:
		return "first fragment without ports"
	case TooManyHeaders:
		return "too many extension headers"
	case AdminDeny:
		return "admin tier deny"
	case BaselineDeny:
		return "baseline tier deny"
	}
	return "reason " + strconv.Itoa(int(r))
}

// ProtoName names IP protocol p as Kubernetes and the status do: TCP,
// UDP, SCTP, ICMP, ICMPv6, else its number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return string(TCP)
	case ProtoUDP:
		return string(UDP)
	case ProtoSCTP:
		return string(SCTP)
	case ProtoICMP:
		return "ICMP"
	case ProtoICMPv6:
		return "ICMPv6"
	}
	return strconv.Itoa(int(p))
}

// Denial is one denied connection or flow, as the status reports it.
type Denial struct {
	Time      time.Time `json:"time"`
	Direction string    `json:"direction"`
	Protocol  string    `json:"protocol"`
	// Peer is the source of an ingress denial, the destination of an
	// egress one; Port the pod's port for ingress, the peer's for egress
	// (none for ICMP); Local the pod's address.
	Peer  netip.Addr `json:"peer,omitzero"`
	Port  uint16     `json:"port,omitempty"`
	Local netip.Addr `json:"local,omitzero"`
	// Layer is the layer that denied the flow: Admin or Baseline (a
	// ClusterNetworkPolicy's Deny rule), NetworkPolicy (no rule of the
	// isolating policies admits it); empty for a flow no layer was asked
	// about (Reason says why).
	Layer Tier `json:"layer,omitempty"`
	// Policies are, for NetworkPolicy, the policies that isolate the pod
	// in Direction ("namespace/name", joined with ","): none of their
	// rules admitted the flow; "(pending)" before the agent's first push.
	// For a tier, the ClusterNetworkPolicy whose Deny rule matched.
	Policies string `json:"policies"`
	// Reason is Reason's text: "no rule admits" for a flow the rules
	// simply do not allow.
	Reason string `json:"reason"`
	// Generation is the policy's in force.
	Generation uint64 `json:"generation"`
}

// RecentDenials is how many denials a stack keeps for its status: the
// last ones, to see why a connection failed just now. The per-direction
// counters count all of them.
const RecentDenials = 64

// Status is the policy in force and the denials, for the control socket.
type Status struct {
	Generation      uint64 `json:"generation"`
	IngressIsolated bool   `json:"ingressIsolated"`
	EgressIsolated  bool   `json:"egressIsolated"`
	Denied          Denied `json:"denied"`
	// RecentDenials are the last RecentDenials denials, oldest first.
	RecentDenials []Denial `json:"recentDenials,omitempty"`
	// DenialLogsSuppressed counts the denials that got no log line
	// (the rate limit).
	DenialLogsSuppressed uint64 `json:"denialLogsSuppressed,omitempty"`
	// Layers counts the policies in force in each layer, both directions
	// together; nil when no ClusterNetworkPolicy applies to the pod.
	Layers *LayerCounts `json:"layers,omitempty"`
}

// LayerCounts are how many policies of each layer a pod's policy holds:
// ClusterNetworkPolicies of the Admin and Baseline tiers, the
// NetworkPolicies that isolate it.
type LayerCounts struct {
	Admin         int `json:"admin"`
	NetworkPolicy int `json:"networkPolicy"`
	Baseline      int `json:"baseline"`
}

// Denied counts denials per isolating policies' label.
type Denied struct {
	Ingress map[string]uint64 `json:"ingress"`
	Egress  map[string]uint64 `json:"egress"`
}

// ErrStale is the error of a push older than the policy in force.
var ErrStale = errors.New("policy is older than the one in force")

// ErrOff is the error of a push to a stack that does not enforce policy
// (stackconfig.Config.Policy false).
var ErrOff = errors.New("policy enforcement is off")
