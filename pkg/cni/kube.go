package cni

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
)

// apiTimeout bounds each API server call: ADD must answer its runtime.
const apiTimeout = 2 * time.Second

// kubeClient is the API client of the conflist's kubeconfig, nil when
// there is none or it cannot be used (logged).
func (inv *invocation) kubeClient() *kube.Client {
	if inv.kube != nil || inv.conf.Kubeconfig == "" {
		return inv.kube
	}
	c, err := kube.LoadKubeconfig(inv.conf.Kubeconfig)
	if err != nil {
		inv.log.Warn("kubeconfig unusable", "path", inv.conf.Kubeconfig, "err", err)
		return nil
	}
	inv.kube = c
	return c
}

// loadAnnotations reads the pod's annotations from the API server when
// the runtime did not pass them (no io.kubernetes.cri.pod-annotations
// capability) and a kubeconfig is configured. An API server that cannot
// be reached is CNI code 11: the runtime retries, and the pod never gets a
// GSO mode by silent default.
func (inv *invocation) loadAnnotations() error {
	if inv.conf.RuntimeConfig.PodAnnotations != nil || inv.conf.Kubeconfig == "" {
		return nil
	}
	ns, name := string(inv.pod.K8S_POD_NAMESPACE), string(inv.pod.K8S_POD_NAME)
	if name == "" {
		return nil // not a Kubernetes pod: the conflist's default applies
	}
	c := inv.kubeClient()
	if c == nil {
		return errorf(types.ErrTryAgainLater, "reading annotations of pod %s/%s: kubeconfig %s is unusable (see plugin.log)", ns, name, inv.conf.Kubeconfig)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	ann, uid, err := c.PodAnnotations(ctx, ns, name)
	if want := string(inv.pod.K8S_POD_UID); err == nil && want != "" && uid != want {
		// The name belongs to another incarnation of the pod.
		return errorf(types.ErrTryAgainLater, "pod %s/%s on the API server has UID %s, the runtime's has %s", ns, name, uid, want)
	}
	switch {
	case err == nil:
		if ann == nil {
			ann = map[string]string{}
		}
		inv.conf.RuntimeConfig.PodAnnotations = ann
		return nil
	case errors.Is(err, kube.ErrUnreachable), errors.Is(err, kube.ErrNotFound):
		// Not found: the API server may lag behind the kubelet's view.
		return errorf(types.ErrTryAgainLater, "reading annotations of pod %s/%s from the API server: %v", ns, name, err)
	default:
		return errorf(types.ErrInternal, "reading annotations of pod %s/%s from the API server: %v", ns, name, err)
	}
}

// event posts an Event on the pod, best effort: ADD never fails because
// of its Events, but it does wait for the post, up to apiTimeout (2 s)
// when the API server is slow or unreachable.
func (inv *invocation) event(typ, reason, msg string) {
	uid := string(inv.pod.K8S_POD_UID)
	if uid == "" || inv.conf.Kubeconfig == "" {
		return
	}
	c := inv.kubeClient()
	if c == nil {
		return
	}
	node := inv.conf.NodeName
	if node == "" {
		node, _ = os.Hostname()
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := c.Event(ctx, kube.Event{
		Namespace: string(inv.pod.K8S_POD_NAMESPACE), PodName: string(inv.pod.K8S_POD_NAME), PodUID: uid,
		Type: typ, Reason: reason, Message: msg, Action: "AddNetwork", Node: node,
	})
	if err != nil {
		inv.log.Warn("posting event", "reason", reason, "err", fmt.Errorf("%w", err))
	}
}
