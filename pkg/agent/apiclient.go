package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
	"github.com/cni-usernet/cni-usernet/pkg/agent/podevent"
)

// serviceAccountDir is where kubelet mounts the agent pod's service
// account: its namespace is read there (rest.InClusterConfig reads the
// token and CA).
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// apiClient is the agent's own calls to the API server, through
// client-go's REST clients of the two groups it reads. Not the typed
// clientset: its scheme registers every API group and, with its apply
// configurations and discovery, doubles the agent's binary.
type apiClient struct {
	rest *rest.Config
	core *rest.RESTClient // core/v1
	apps *rest.RESTClient // apps/v1
	// events posts the agent's Events, the policy controller's too.
	events *podevent.Client
	// caPEM is the service account's CA, written into the plugin's
	// kubeconfig.
	caPEM []byte
}

// inCluster builds the client from the pod's service account.
func inCluster() (*apiClient, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the service account: %w", err)
	}
	cfg.UserAgent = "cni-usernet-agent"
	ca, err := os.ReadFile(cfg.TLSClientConfig.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the service account CA: %w", err)
	}
	return newAPIClient(cfg, ca)
}

// newAPIClient is the client for cfg, whose server's CA is ca.
func newAPIClient(cfg *rest.Config, ca []byte) (*apiClient, error) {
	c := &apiClient{rest: cfg, caPEM: ca}
	var err error
	if c.core, err = groupClient(cfg, corev1.SchemeGroupVersion); err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	if c.apps, err = groupClient(cfg, appsv1.SchemeGroupVersion); err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	if c.events, err = podevent.New(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// scheme is the two groups the agent's own calls read and write.
var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
}

// groupClient is a JSON client for the collections of gv.
func groupClient(cfg *rest.Config, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = codecs.WithoutConversion()
	return rest.RESTClientFor(c)
}

// inClusterNamespace is the namespace the agent's pod runs in.
func inClusterNamespace() (string, error) {
	b, err := os.ReadFile(filepath.Join(serviceAccountDir, "namespace"))
	if err != nil {
		return "", fmt.Errorf("reading the pod's namespace: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// nodePodCIDRs returns the pod CIDRs the control plane assigned to a node
// (RBAC: get nodes); empty until it has.
func (c *apiClient) nodePodCIDRs(ctx context.Context, node string) ([]string, error) {
	n := &corev1.Node{}
	if err := c.core.Get().Resource("nodes").Name(node).Do(ctx).Into(n); err != nil {
		return nil, fmt.Errorf("reading node %s: %w", node, err)
	}
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs, nil
	}
	// podCIDR alone is what API servers before dual stack (1.16) fill.
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}, nil
	}
	return []string{}, nil
}

// nodeListPage bounds one page of the node list: a Node with many images
// is tens of KiB.
const nodeListPage = 50

// listNodes returns every node as routing between nodes needs it (RBAC:
// list nodes), page by page. Unparsable addresses and CIDRs are left out.
func (c *apiClient) listNodes(ctx context.Context) ([]noderoutes.Node, error) {
	var out []noderoutes.Node
	opts := metav1.ListOptions{Limit: nodeListPage}
	for {
		list := &corev1.NodeList{}
		err := c.core.Get().Resource("nodes").VersionedParams(&opts, parameterCodec).Do(ctx).Into(list)
		if err != nil {
			return nil, fmt.Errorf("listing nodes: %w", err)
		}
		for _, it := range list.Items {
			n := noderoutes.Node{Name: it.Name}
			cidrs := it.Spec.PodCIDRs
			if len(cidrs) == 0 && it.Spec.PodCIDR != "" {
				cidrs = []string{it.Spec.PodCIDR}
			}
			for _, s := range cidrs {
				if p, err := netip.ParsePrefix(s); err == nil {
					n.PodCIDRs = append(n.PodCIDRs, p)
				}
			}
			n.InternalIPs = internalIPs(&it)
			out = append(out, n)
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// nodeInternalIPs returns a node's InternalIPs (RBAC: get nodes).
func (c *apiClient) nodeInternalIPs(ctx context.Context, node string) ([]netip.Addr, error) {
	n := &corev1.Node{}
	if err := c.core.Get().Resource("nodes").Name(node).Do(ctx).Into(n); err != nil {
		return nil, fmt.Errorf("reading node %s: %w", node, err)
	}
	return internalIPs(n), nil
}

// internalIPs are a node's addresses of type InternalIP; unparsable ones
// are left out.
func internalIPs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// daemonSetExists says whether a DaemonSet exists and is not being
// deleted (RBAC: get daemonsets.apps): an uninstall (its DaemonSet
// deleted, or marked for a foreground deletion) or a restart.
func (c *apiClient) daemonSetExists(ctx context.Context, namespace, name string) (bool, error) {
	ds := &appsv1.DaemonSet{}
	err := c.apps.Get().Namespace(namespace).Resource("daemonsets").Name(name).Do(ctx).Into(ds)
	switch {
	case err == nil:
		return ds.DeletionTimestamp == nil, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("reading DaemonSet %s/%s: %w", namespace, name, err)
}

// podUID is a pod's UID (RBAC: get pods), which its Events need.
func (c *apiClient) podUID(ctx context.Context, namespace, name string) (string, error) {
	p := &corev1.Pod{}
	if err := c.core.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(p); err != nil {
		return "", fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	}
	return string(p.UID), nil
}

// event posts e as a core/v1 Event on its pod (RBAC: create events)
// through the client the policy controller posts its Events with.
func (c *apiClient) event(ctx context.Context, e podevent.Event) error {
	return c.events.Post(ctx, e)
}

// apiFailure says in words why an API request failed, for the logs: the
// agent's one reading of client-go's errors.
func apiFailure(err error) string {
	switch {
	case apierrors.IsUnauthorized(err):
		return "token rejected (the ServiceAccount was deleted, or deleted and created again)"
	case apierrors.IsForbidden(err):
		return "forbidden (the ClusterRole or its binding was deleted)"
	case isUnreachable(err):
		return "API server unreachable"
	case apierrors.IsNotFound(err):
		return "not found"
	}
	return "request failed"
}

// isUnreachable says whether the API server did not serve a request: no
// connection or answer, or an answer that says to try again later.
func isUnreachable(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsInternalError(err)
}
