package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
)

// object is a JSON object that keeps its members in order, so that a
// configuration we edit differs from the original only where we changed
// it (Go maps would sort the keys).
type object []member

type member struct {
	key   string
	value json.RawMessage
}

func parseObject(data []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var o object
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := t.(string)
		if !ok {
			return nil, fmt.Errorf("object key %v is not a string", t)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		o = append(o, member{key, v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return o, nil
}

// get returns the value of key; with duplicate keys, the last one wins, as
// in encoding/json.
func (o object) get(key string) (json.RawMessage, bool) {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].key == key {
			return o[i].value, true
		}
	}
	return nil, false
}

func (o object) set(key string, v json.RawMessage) object {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].key == key {
			o[i].value = v
			return o
		}
	}
	return append(o, member{key, v})
}

// marshal writes the object indented by two spaces, the layout of the
// configurations Calico, Cilium and flannel write, with a final newline.
func (o object) marshal() ([]byte, error) {
	var flat bytes.Buffer
	flat.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			flat.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		flat.Write(k)
		flat.WriteByte(':')
		if err := json.Compact(&flat, m.value); err != nil {
			return nil, fmt.Errorf("value of %q: %w", m.key, err)
		}
	}
	flat.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, flat.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func pluginType(raw []byte) string {
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return ""
	}
	return p.Type
}

func sameJSON(a, b []byte) bool {
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if da.Decode(&va) != nil || db.Decode(&vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// conflist is a parsed configuration list: its members in order and its
// plugins.
type conflist struct {
	obj     object
	plugins []json.RawMessage
}

func parseConflist(data []byte) (*conflist, error) {
	obj, err := parseObject(data)
	if err != nil {
		return nil, err
	}
	raw, ok := obj.get("plugins")
	if !ok {
		// libcni would load the plugins from a subdirectory named after
		// the network, after any inline ones; we could only put ours in
		// front of them there.
		return nil, errors.New(`no inline "plugins" list`)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return nil, fmt.Errorf(`"plugins" is not a list of objects: %w`, err)
	}
	if len(plugins) == 0 {
		return nil, errors.New(`empty "plugins" list`)
	}
	return &conflist{obj: obj, plugins: plugins}, nil
}

func (c *conflist) has(name string) bool {
	for _, p := range c.plugins {
		if pluginType(p) == name {
			return true
		}
	}
	return false
}

func (c *conflist) marshal() ([]byte, error) {
	plugins := make([]json.RawMessage, len(c.plugins))
	for i, p := range c.plugins {
		var b bytes.Buffer
		if err := json.Compact(&b, p); err != nil {
			return nil, fmt.Errorf("plugin %d: %w", i, err)
		}
		plugins[i] = b.Bytes()
	}
	raw, err := json.Marshal(plugins)
	if err != nil {
		return nil, err
	}
	c.obj = c.obj.set("plugins", raw)
	return c.obj.marshal()
}

// chain puts plugin into the list, and says whether that changed it.
//
// A new entry goes at the end. Every plugin before it, the one that makes
// the interface and those that still shape it in the pod (tuning's MAC,
// MTU and sysctls, sbr's routes), has then finished when our stack takes
// over eth0's configuration; the meta plugins that usually follow
// (portmap, bandwidth, firewall) work from prevResult and host-side
// objects, so they do not care whether they run before us. Istio's and
// Cilium's chaining installers also append.
//
// An existing entry of ours keeps its place and is replaced when it
// differs; duplicates are dropped.
func (c *conflist) chain(name string, plugin json.RawMessage) bool {
	var at []int
	for i, p := range c.plugins {
		if pluginType(p) == name {
			at = append(at, i)
		}
	}
	if len(at) == 1 && sameJSON(c.plugins[at[0]], plugin) {
		return false
	}
	if len(at) == 0 {
		c.plugins = append(c.plugins, plugin)
		return true
	}
	out := make([]json.RawMessage, 0, len(c.plugins))
	for i, p := range c.plugins {
		switch {
		case i == at[0]:
			out = append(out, plugin)
		case pluginType(p) != name:
			out = append(out, p)
		}
	}
	c.plugins = out
	return true
}

// hasAny says whether the list holds an entry equal to one of objs.
func (c *conflist) hasAny(objs []json.RawMessage) bool {
	for _, p := range c.plugins {
		if slices.ContainsFunc(objs, func(o json.RawMessage) bool { return sameJSON(o, p) }) {
			return true
		}
	}
	return false
}

// addAfter puts each of objs after our entry (name), unless the list
// already has a plugin of its type, and returns the ones it added. They go
// after ours so that each gets our result as prevResult: the pod's
// addresses. Those that look for the pod's veth in the pod's namespace
// (beforeOurs) go just before ours instead: our ADD moves the earlier
// plugin's interface into the stack's namespace, where they would not
// find it, and our DEL moves it back before theirs runs.
func (c *conflist) addAfter(name string, objs [][]byte) []json.RawMessage {
	var added []json.RawMessage
	for _, o := range objs {
		if c.has(pluginType(o)) {
			continue
		}
		ours := len(c.plugins)
		for i := len(c.plugins) - 1; i >= 0; i-- {
			if pluginType(c.plugins[i]) == name {
				ours = i
				break
			}
		}
		at := min(ours+1, len(c.plugins))
		if beforeOurs[pluginType(o)] {
			at = ours
		} else {
			// After the ones added before it, in the order given.
			for at < len(c.plugins) && slices.ContainsFunc(added, func(a json.RawMessage) bool { return sameJSON(a, c.plugins[at]) }) {
				at++
			}
		}
		c.plugins = slices.Insert(c.plugins, at, json.RawMessage(o))
		added = append(added, json.RawMessage(o))
	}
	return added
}

// beforeOurs are the meta plugins that find the pod's veth through the
// pod's CNI_IFNAME (the bandwidth plugin: the node end is its peer).
var beforeOurs = map[string]bool{"bandwidth": true}

// stripSame removes the entries equal to one of objs (the ones we added)
// whose type keep does not name, and says whether there were any.
func (c *conflist) stripSame(objs []json.RawMessage, keep func(typ string) bool) bool {
	out := c.plugins[:0:0]
	for _, p := range c.plugins {
		ours := slices.ContainsFunc(objs, func(o json.RawMessage) bool { return sameJSON(o, p) })
		if !ours || keep(pluginType(p)) {
			out = append(out, p)
		}
	}
	changed := len(out) != len(c.plugins)
	c.plugins = out
	return changed
}

// strip removes our entries from the list and says whether there were any.
func (c *conflist) strip(name string) bool {
	out := c.plugins[:0:0]
	for _, p := range c.plugins {
		if pluginType(p) != name {
			out = append(out, p)
		}
	}
	changed := len(out) != len(c.plugins)
	c.plugins = out
	return changed
}

// listFromConf turns a single-plugin configuration (.conf, .json) into a
// list the way libcni.ConfListFromConf does when a runtime loads it: the
// list takes the plugin's name and cniVersion, and the plugin object is
// kept whole.
func listFromConf(data []byte) (*conflist, error) {
	obj, err := parseObject(data)
	if err != nil {
		return nil, err
	}
	var head struct {
		Name       string `json:"name"`
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, err
	}
	if _, isList := obj.get("plugins"); isList {
		return nil, errors.New(`a list ("plugins") in a single-plugin file: runtimes reject it`)
	}
	name, _ := json.Marshal(head.Name)
	version, _ := json.Marshal(head.CNIVersion)
	return &conflist{
		obj:     object{{"cniVersion", version}, {"name", name}},
		plugins: []json.RawMessage{data},
	}, nil
}
