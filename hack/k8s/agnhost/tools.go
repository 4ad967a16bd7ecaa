//go:build tools

// Package tools pins agnhost, the Kubernetes e2e test image's one binary,
// at the release the lab runs (hack/k8s/toolmod), for the image
// hack/k8s/images/build-images.sh makes under agnhost's upstream name.
package tools

import (
	_ "k8s.io/kubernetes/test/images/agnhost"
)
