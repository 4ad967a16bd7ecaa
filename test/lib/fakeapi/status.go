// SPDX-License-Identifier: Apache-2.0

package fakeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"sigs.k8s.io/yaml"
)

// errNotStored is a write to an object the store does not hold.
var errNotStored = errors.New("not found")

// patchStatus serves a server-side apply (application/apply-patch+yaml)
// to an object's status subresource, applied minimally: the patch's
// status fields replace the object's, but for lists of objects keyed by
// "type" (conditions, listType=map), merged entry by entry, so that the
// entries of other field managers stay. Spec, metadata and generation are
// left as they are; the object gets a new resourceVersion and the watches
// a MODIFIED.
func (s *Server) patchStatus(w http.ResponseWriter, req *http.Request, r route, k Kind) {
	s.count(s.counts, "patch "+k.Resource+"/status")
	if ct := req.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/apply-patch+yaml") {
		writeStatus(w, http.StatusUnsupportedMediaType, "UnsupportedMediaType", "the fake API server applies only application/apply-patch+yaml to a status, not "+ct)
		return
	}
	if req.URL.Query().Get("fieldManager") == "" {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "PATCH type application/apply-patch+yaml requires fieldManager")
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "reading the patch: "+err.Error())
		return
	}
	var patch struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Status map[string]json.RawMessage `json:"status"`
	}
	doc, err := yaml.YAMLToJSON(body)
	if err == nil {
		err = json.Unmarshal(doc, &patch)
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "decoding the patch: "+err.Error())
		return
	}
	if patch.Metadata.Name != r.name {
		writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("the patch names %q, the path %q", patch.Metadata.Name, r.name))
		return
	}
	ns := r.ns
	if !k.Namespaced {
		ns = ""
	}
	raw, err := s.Store.PatchStatus(k.Resource, ns, r.name, patch.Status)
	switch {
	case errors.Is(err, errNotStored):
		writeStatus(w, http.StatusNotFound, "NotFound", fmt.Sprintf("%s %q not found", k.Resource, r.name))
		return
	case err != nil:
		writeStatus(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(s.withKind(raw, k))
}

// PatchStatus merges status into the status of ns/name (ns empty for a
// cluster-wide kind) as patchStatus does, sends MODIFIED to the watches
// and returns the object's JSON as a list holds it.
func (s *Store) PatchStatus(resource, ns, name string, status map[string]json.RawMessage) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.objs[resource][ns+"/"+name]
	if o == nil {
		return nil, fmt.Errorf("patching the status of %s %s/%s: %w", resource, ns, name, errNotStored)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(o.raw, &top); err != nil {
		return nil, err
	}
	cur := map[string]json.RawMessage{}
	if b, ok := top["status"]; ok && string(b) != "null" {
		if err := json.Unmarshal(b, &cur); err != nil {
			return nil, fmt.Errorf("reading the status of %s %s/%s: %w", resource, ns, name, err)
		}
	}
	for f, v := range status {
		cur[f] = mergeByType(cur[f], v)
	}
	top["status"], _ = json.Marshal(cur)
	st, err := s.writeLocked(resource, "", top)
	if err != nil {
		return nil, err
	}
	s.wakeLocked()
	return st.raw, nil
}

// mergeByType is patch merged into cur when both are lists of objects
// with a "type" (an entry of patch replaces cur's of its type, in place,
// or is appended); patch otherwise.
func mergeByType(cur, patch json.RawMessage) json.RawMessage {
	var have, add []map[string]any
	if json.Unmarshal(cur, &have) != nil || json.Unmarshal(patch, &add) != nil || !allTyped(have) || !allTyped(add) {
		return patch
	}
	for _, e := range add {
		i := 0
		for i < len(have) && have[i]["type"] != e["type"] {
			i++
		}
		if i == len(have) {
			have = append(have, e)
		} else {
			have[i] = e
		}
	}
	out, _ := json.Marshal(have)
	return out
}

func allTyped(l []map[string]any) bool {
	for _, e := range l {
		if _, ok := e["type"].(string); !ok {
			return false
		}
	}
	return true
}
