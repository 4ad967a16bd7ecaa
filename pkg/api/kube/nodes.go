package kube

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

// NodeInfo is what routing between nodes needs of a Node.
type NodeInfo struct {
	Name string
	// InternalIPs are status.addresses of type InternalIP, in order.
	InternalIPs []string
	// PodCIDRs are spec.podCIDRs, or spec.podCIDR on API servers before
	// dual stack; empty until the control plane allocates them.
	PodCIDRs []string
}

// nodeListPage bounds one page of a node list: a Node with many images is
// tens of KiB, so a page stays far below maxBody.
const nodeListPage = 50

// ListNodes returns every node (RBAC: list nodes), page by page.
func (c *Client) ListNodes(ctx context.Context) ([]NodeInfo, error) {
	var out []NodeInfo
	cont := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(nodeListPage)}}
		if cont != "" {
			q.Set("continue", cont)
		}
		r := request{
			method: http.MethodGet, verb: "list", resource: "nodes",
			path: objectPath("/api/v1", "", "nodes", "") + "?" + q.Encode(),
		}
		var list struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
			Items []struct {
				Metadata objectMeta `json:"metadata"`
				Spec     struct {
					PodCIDR  string   `json:"podCIDR"`
					PodCIDRs []string `json:"podCIDRs"`
				} `json:"spec"`
				Status struct {
					Addresses []struct {
						Type    string `json:"type"`
						Address string `json:"address"`
					} `json:"addresses"`
				} `json:"status"`
			} `json:"items"`
		}
		if err := c.do(ctx, r, &list); err != nil {
			return nil, err
		}
		for _, it := range list.Items {
			n := NodeInfo{Name: it.Metadata.Name, PodCIDRs: it.Spec.PodCIDRs}
			if len(n.PodCIDRs) == 0 && it.Spec.PodCIDR != "" {
				n.PodCIDRs = []string{it.Spec.PodCIDR}
			}
			for _, a := range it.Status.Addresses {
				if a.Type == "InternalIP" {
					n.InternalIPs = append(n.InternalIPs, a.Address)
				}
			}
			out = append(out, n)
		}
		if cont = list.Metadata.Continue; cont == "" {
			return out, nil
		}
	}
}
