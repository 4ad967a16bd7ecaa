package watch

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
)

// asDecoded is what the compiler's type holds of an API object when it
// is decoded from the object's JSON: every field netpolicy names, under
// the API's JSON names. A converter must give the same.
func asDecoded[T any](t *testing.T, obj any) *T {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func fullMeta() metav1.ObjectMeta {
	del := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "u", ResourceVersion: "7",
		Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"dropped": "yes"}, DeletionTimestamp: &del}
}

// TestConvertersKeepEveryCompiledField: each converter carries every
// field of the compiler's types, so that a field added to netpolicy
// (decoded from JSON in its tests) is not silently missing from what the
// agent's watches give it. Fails when a converter forgets one.
func TestConvertersKeepEveryCompiledField(t *testing.T) {
	proxy := corev1.LoadBalancerIPModeProxy
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := int32(8080)
	ready := true
	svc := &corev1.Service{ObjectMeta: fullMeta(),
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.0.0.1", ClusterIPs: []string{"10.0.0.1", "fd00::1"},
			ExternalIPs: []string{"192.0.2.1"}, Ports: []corev1.ServicePort{{Name: "http", Protocol: tcp, Port: 80, NodePort: 30080, TargetPort: intstr.FromString("web")}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.51.100.1", IPMode: &proxy}, {IP: "198.51.100.2"}}}}}
	pod := &corev1.Pod{ObjectMeta: fullMeta(),
		Spec: corev1.PodSpec{NodeName: "node", HostNetwork: true, Containers: []corev1.Container{
			{Name: "c", Image: "dropped", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080, Protocol: tcp}, {ContainerPort: 53, Protocol: udp}}}, {Name: "d"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.1.0.5"}, {IP: "fd01::5"}}}}
	sliceMeta := fullMeta()
	sliceMeta.Labels[netpolicy.ServiceNameLabel] = "svc"
	slice := &discoveryv1.EndpointSlice{ObjectMeta: sliceMeta, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}, {Addresses: []string{"10.1.0.6"}}},
		Ports:     []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: &tcp, Port: &port}}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: fullMeta(), Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}, NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"t": "y"}}}, {IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromString("web"))}, {Protocol: &udp, Port: ptr(intstr.FromInt32(53)), EndPort: ptr(int32(60))}},
		}},
		Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}}},
	}}
	// Labels are kept where the compiler reads them: a pod's, and an
	// EndpointSlice's Service name.
	decodedSvc := asDecoded[netpolicy.Service](t, svc)
	decodedSvc.Metadata.Labels = nil
	decodedSlice := asDecoded[netpolicy.EndpointSlice](t, slice)
	decodedSlice.Metadata.Labels = map[string]string{netpolicy.ServiceNameLabel: "svc"}
	decodedNP := asDecoded[netpolicy.NetworkPolicy](t, np)
	decodedNP.Metadata.Labels = nil
	// A pod's labels are interned: so are the decoded ones, for
	// DeepEqual to compare what they hold.
	decodedPod := asDecoded[netpolicy.Pod](t, pod)
	decodedPod.Metadata.InternLabels()
	for _, c := range []struct {
		name      string
		converted any
		decoded   any
	}{
		{"Service", service(svc), decodedSvc},
		{"Pod", pod2(pod), decodedPod},
		{"EndpointSlice", endpointSlice(slice), decodedSlice},
		{"NetworkPolicy", networkPolicy(np), decodedNP},
	} {
		if !reflect.DeepEqual(c.converted, c.decoded) {
			got, _ := json.Marshal(c.converted)
			want, _ := json.Marshal(c.decoded)
			t.Errorf("%s: the converter gives\n  %s\nthe object's JSON decodes to\n  %s", c.name, got, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// pod2 is pod under another name: the test's variable pod shadows it.
var pod2 = pod
