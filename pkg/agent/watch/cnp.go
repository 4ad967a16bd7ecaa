// SPDX-License-Identifier: Apache-2.0

package watch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
)

// ClusterNetworkPolicies are sig-network's cluster-scoped policies
// (sigs.k8s.io/network-policy-api), served by a CRD that a cluster may not
// have installed: a list the server answers 404 is an empty collection
// (Informer.Absent), checked again at every relist.
var ClusterNetworkPolicies = Kind{"policy.networking.k8s.io", "v1beta1", "clusternetworkpolicies"}

var cnpGV = schema.GroupVersion{Group: ClusterNetworkPolicies.Group, Version: ClusterNetworkPolicies.Version}

// cnpObject is a ClusterNetworkPolicy as the watch decodes it: its
// metadata typed, its spec raw, read into netpolicy's types by the
// transform, and the conditions of its status, among which the agents'
// own. The agent links no client of the network-policy-api module: these
// few lines stand for its types and generated code.
type cnpObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              json.RawMessage `json:"spec"`
	Status            cnpStatus       `json:"status"`
}

// cnpStatus is v1beta1 ClusterNetworkPolicyStatus.
type cnpStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

func (o *cnpObject) DeepCopyObject() runtime.Object {
	c := &cnpObject{TypeMeta: o.TypeMeta, Spec: slices.Clone(o.Spec)}
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	for _, cond := range o.Status.Conditions {
		var cc metav1.Condition
		cond.DeepCopyInto(&cc)
		c.Status.Conditions = append(c.Status.Conditions, cc)
	}
	return c
}

type cnpObjectList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []cnpObject `json:"items"`
}

func (l *cnpObjectList) DeepCopyObject() runtime.Object {
	c := &cnpObjectList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i := range l.Items {
		c.Items = append(c.Items, *l.Items[i].DeepCopyObject().(*cnpObject))
	}
	return c
}

func init() {
	scheme.AddKnownTypeWithName(cnpGV.WithKind("ClusterNetworkPolicy"), &cnpObject{})
	scheme.AddKnownTypeWithName(cnpGV.WithKind("ClusterNetworkPolicyList"), &cnpObjectList{})
	metav1.AddToGroupVersion(scheme, cnpGV)
	collections[ClusterNetworkPolicies] = &collection[netpolicy.ClusterNetworkPolicy]{
		kind: ClusterNetworkPolicies, item: cnpGV.WithKind("ClusterNetworkPolicy"),
		// A custom resource has no protobuf encoding.
		accept: "application/json", acceptList: "application/json",
		newList:   func() runtime.Object { return &cnpObjectList{} },
		transform: typed(clusterNetworkPolicy),
		optional:  true,
	}
}

// clusterNetworkPolicy reads a ClusterNetworkPolicy's spec, and notes the
// fields netpolicy's types do not have (a newer API's): the compiler
// reports them and fails closed where they sit. A spec that does not
// decode at all is one whose every rule fails closed: an Admin tier
// policy that denies everything to its subject is not what a bad object
// should become, so it keeps only its subject, tier and priority as far
// as they decode, and the decoding error as its unknown field.
func clusterNetworkPolicy(o *cnpObject) *netpolicy.ClusterNetworkPolicy {
	out := &netpolicy.ClusterNetworkPolicy{Metadata: bareMeta(&o.ObjectMeta), Generation: o.Generation}
	// Only the agents' own condition is kept: the others are other
	// implementations', which the agent neither reads nor writes.
	for _, c := range o.Status.Conditions {
		if c.Type == netpolicy.ImplementedCondition {
			out.Implemented = &netpolicy.ClusterPolicyCondition{Status: string(c.Status), Reason: c.Reason, Message: c.Message,
				ObservedGeneration: c.ObservedGeneration, LastTransitionTime: c.LastTransitionTime.UTC()}
		}
	}
	if err := json.Unmarshal(o.Spec, &out.Spec); err != nil {
		out.Unknown = append(out.Unknown, fmt.Sprintf("spec (%v)", err))
		return out
	}
	var generic any
	d := json.NewDecoder(bytes.NewReader(o.Spec))
	d.UseNumber()
	if d.Decode(&generic) == nil {
		out.Unknown = unknownFields(generic, reflect.TypeOf(out.Spec), "spec")
	}
	return out
}

// unknownFields are the paths of v's object keys that t (a struct, by its
// json tags) has no field for, sorted.
func unknownFields(v any, t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	switch x := v.(type) {
	case map[string]any:
		if t.Kind() != reflect.Struct {
			return nil
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			ft, ok := fields[k]
			if !ok {
				out = append(out, path+"."+k)
				continue
			}
			out = append(out, unknownFields(x[k], ft, path+"."+k)...)
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return nil
		}
		for i, e := range x {
			out = append(out, unknownFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return out
}
