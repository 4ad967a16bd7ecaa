package kube

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// parseYAML parses the YAML that kubeconfig files are written in into
// map[string]any, []any, string, bool and nil, which encoding/json can
// then map onto typed structs.
//
// It is a subset on purpose: a full YAML library would be the plugin's
// largest dependency, for a file format that kubectl, kubeadm and every
// installer write the same plain way. Supported: block mappings and
// sequences (including a sequence at its key's indentation), one-line flow
// mappings and sequences, plain, single- and double-quoted scalars,
// comments, a leading "---". Refused with an error naming the line: block
// scalars (| and >), anchors, aliases, tags, complex keys, multi-line
// flow collections and plain scalars, tabs in indentation, more than one
// document. Plain scalars stay strings except null, ~, true and false:
// no kubeconfig field we read is a number.
func parseYAML(data []byte) (any, error) {
	lines, err := yamlLines(string(data))
	if err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, nil
	}
	p := &yamlParser{lines: lines}
	v, err := p.block(lines[0].indent)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.lines) {
		return nil, p.errorf("unexpected indentation")
	}
	return v, nil
}

type yamlLine struct {
	num    int // 1-based, for errors
	indent int
	text   string // without indentation, comment and trailing blanks
}

func yamlLines(s string) ([]yamlLine, error) {
	s = strings.TrimPrefix(s, "\uFEFF")
	var out []yamlLine
	for i, raw := range strings.Split(s, "\n") {
		num := i + 1
		raw = strings.TrimSuffix(raw, "\r")
		body := strings.TrimLeft(raw, " ")
		indent := len(raw) - len(body)
		text, err := stripComment(body)
		if err != nil {
			return nil, fmt.Errorf("yaml line %d: %w", num, err)
		}
		text = strings.TrimRight(text, " \t")
		if text == "" {
			continue
		}
		if strings.HasPrefix(body, "\t") {
			return nil, fmt.Errorf("yaml line %d: tab in indentation", num)
		}
		if indent == 0 && strings.HasPrefix(text, "%") {
			if len(out) > 0 {
				return nil, fmt.Errorf("yaml line %d: directive after content", num)
			}
			continue
		}
		if indent == 0 && (text == "---" || strings.HasPrefix(text, "--- ")) {
			if len(out) > 0 {
				return nil, fmt.Errorf("yaml line %d: more than one document", num)
			}
			if rest := strings.TrimSpace(text[3:]); rest != "" {
				return nil, fmt.Errorf("yaml line %d: content after ---", num)
			}
			continue
		}
		if indent == 0 && text == "..." {
			break
		}
		out = append(out, yamlLine{num: num, indent: indent, text: text})
	}
	return out, nil
}

// stripComment cuts a "#" comment that starts the line or follows a blank,
// outside quoted scalars.
func stripComment(s string) (string, error) {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quote == '\'' {
			if c == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					i++
				} else {
					quote = 0
				}
			}
			continue
		}
		if quote == '"' {
			switch c {
			case '\\':
				i++
			case '"':
				quote = 0
			}
			continue
		}
		prev := byte(' ')
		if i > 0 {
			prev = s[i-1]
		}
		switch {
		case c == '#' && (prev == ' ' || prev == '\t'):
			return s[:i], nil
		case (c == '"' || c == '\'') && strings.IndexByte(" \t[{,:", prev) >= 0:
			quote = c
		}
	}
	if quote != 0 {
		return "", fmt.Errorf("unterminated %c-quoted scalar (multi-line scalars are not supported)", quote)
	}
	return s, nil
}

type yamlParser struct {
	lines []yamlLine
	i     int
}

func (p *yamlParser) errorf(format string, args ...any) error {
	num := 0
	if p.i < len(p.lines) {
		num = p.lines[p.i].num
	} else if len(p.lines) > 0 {
		num = p.lines[len(p.lines)-1].num
	}
	return fmt.Errorf("yaml line %d: %s", num, fmt.Sprintf(format, args...))
}

func isSeqItem(text string) bool {
	return text == "-" || strings.HasPrefix(text, "- ")
}

// block parses the node whose first line is p.lines[p.i], at indent.
func (p *yamlParser) block(indent int) (any, error) {
	l := p.lines[p.i]
	if isSeqItem(l.text) {
		return p.sequence(indent)
	}
	if _, _, ok, err := splitKey(l.text); err != nil {
		return nil, p.errorf("%v", err)
	} else if ok {
		return p.mapping(indent)
	}
	p.i++
	v, err := inlineValue(l.text)
	if err != nil {
		return nil, fmt.Errorf("yaml line %d: %w", l.num, err)
	}
	// A scalar on lines of its own is a whole node: anything after it at
	// its indentation or deeper would continue it.
	if p.i < len(p.lines) && p.lines[p.i].indent >= indent {
		return nil, p.errorf("continued scalar (multi-line plain scalars are not supported)")
	}
	return v, nil
}

// nested parses the value of a key or item whose own line ended after
// the ":" or "-": the more indented lines that follow, or, for a key, a
// sequence at the key's own indentation (kubectl's style).
func (p *yamlParser) nested(indent int, seqAtSameIndent bool) (any, error) {
	if p.i >= len(p.lines) {
		return nil, nil
	}
	next := p.lines[p.i]
	switch {
	case next.indent > indent:
		return p.block(next.indent)
	case seqAtSameIndent && next.indent == indent && isSeqItem(next.text):
		return p.sequence(indent)
	}
	return nil, nil
}

func (p *yamlParser) sequence(indent int) (any, error) {
	out := []any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && isSeqItem(p.lines[p.i].text) {
		l := p.lines[p.i]
		rest := strings.TrimLeft(l.text[1:], " ")
		var v any
		var err error
		switch _, _, isKey, kerr := splitKey(rest); {
		case rest == "":
			p.i++
			v, err = p.nested(indent, false)
		case kerr != nil:
			err = p.errorf("%v", kerr)
		case isKey || isSeqItem(rest):
			// "- key: value" opens a mapping whose keys line up with
			// the first one: parse the rest of the line as if it began
			// there.
			col := indent + len(l.text) - len(rest)
			p.lines[p.i] = yamlLine{num: l.num, indent: col, text: rest}
			v, err = p.block(col)
		default:
			p.i++
			if v, err = inlineValue(rest); err != nil {
				err = fmt.Errorf("yaml line %d: %w", l.num, err)
			}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		if p.i < len(p.lines) && p.lines[p.i].indent > indent {
			return nil, p.errorf("unexpected indentation")
		}
	}
	return out, nil
}

func (p *yamlParser) mapping(indent int) (any, error) {
	out := map[string]any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent {
		l := p.lines[p.i]
		if isSeqItem(l.text) {
			return nil, p.errorf("sequence item where a key was expected")
		}
		key, rest, ok, err := splitKey(l.text)
		if err != nil {
			return nil, p.errorf("%v", err)
		}
		if !ok {
			return nil, p.errorf("want \"key: value\", got %q", l.text)
		}
		if _, dup := out[key]; dup {
			return nil, p.errorf("key %q repeated", key)
		}
		p.i++
		var v any
		if rest != "" {
			if v, err = inlineValue(rest); err != nil {
				return nil, fmt.Errorf("yaml line %d: %w", l.num, err)
			}
		} else if v, err = p.nested(indent, true); err != nil {
			return nil, err
		}
		out[key] = v
		if p.i < len(p.lines) && p.lines[p.i].indent > indent {
			return nil, p.errorf("unexpected indentation")
		}
	}
	return out, nil
}

// splitKey splits "key: value" (or "key:") into key and value text. ok is
// false when text is not a mapping entry at all.
func splitKey(text string) (key, rest string, ok bool, err error) {
	if text == "" {
		return "", "", false, nil
	}
	switch text[0] {
	case '"', '\'':
		k, n, err := quoted(text)
		if err != nil {
			return "", "", false, err
		}
		after := strings.TrimLeft(text[n:], " ")
		if after == ":" || strings.HasPrefix(after, ": ") {
			return k, strings.TrimSpace(after[1:]), true, nil
		}
		return "", "", false, nil
	case '{', '[', '|', '>', '&', '*', '!', '-':
		return "", "", false, nil
	case '?':
		if text == "?" || strings.HasPrefix(text, "? ") {
			return "", "", false, fmt.Errorf("complex keys are not supported")
		}
	}
	i := strings.Index(text, ": ")
	if i < 0 {
		if !strings.HasSuffix(text, ":") {
			return "", "", false, nil
		}
		i = len(text) - 1
	}
	key = strings.TrimRight(text[:i], " ")
	if key == "" {
		return "", "", false, nil
	}
	return key, strings.TrimSpace(text[i+1:]), true, nil
}

// inlineValue parses what follows "key:" or "- " on the same line.
func inlineValue(s string) (any, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	switch s[0] {
	case '{', '[':
		f := &flowParser{s: s}
		v, err := f.value()
		if err != nil {
			return nil, err
		}
		f.skipSpace()
		if f.i != len(s) {
			return nil, fmt.Errorf("unexpected %q after a flow collection", s[f.i:])
		}
		return v, nil
	case '"', '\'':
		v, n, err := quoted(s)
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(s[n:]) != "" {
			return nil, fmt.Errorf("unexpected %q after a quoted scalar", s[n:])
		}
		return v, nil
	case '|', '>':
		return nil, fmt.Errorf("block scalars (%c) are not supported", s[0])
	case '&', '*', '!':
		return nil, fmt.Errorf("anchors, aliases and tags (%c) are not supported", s[0])
	}
	return plain(s), nil
}

func plain(s string) any {
	switch s {
	case "", "~", "null", "Null", "NULL":
		return nil
	case "true", "True", "TRUE":
		return true
	case "false", "False", "FALSE":
		return false
	}
	return s
}

// quoted parses the quoted scalar s starts with and returns its value and
// the number of bytes it took.
func quoted(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if q == '\'' {
			if c == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				return b.String(), i + 1, nil
			}
			b.WriteByte(c)
			continue
		}
		switch c {
		case '"':
			return b.String(), i + 1, nil
		case '\\':
			n, err := unescape(&b, s[i+1:])
			if err != nil {
				return "", 0, err
			}
			i += n
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("unterminated %c-quoted scalar", q)
}

// unescape writes the escape sequence at the start of s (after the
// backslash) and returns how many bytes it used.
func unescape(b *strings.Builder, s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("backslash at the end of a quoted scalar")
	}
	simple := map[byte]string{
		'0': "\x00", 'a': "\a", 'b': "\b", 't': "\t", '\t': "\t", 'n': "\n",
		'v': "\v", 'f': "\f", 'r': "\r", 'e': "\x1b", ' ': " ", '"': "\"",
		'/': "/", '\\': "\\", 'N': "\u0085", '_': "\u00a0",
	}
	if r, ok := simple[s[0]]; ok {
		b.WriteString(r)
		return 1, nil
	}
	width := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[0]]
	if width == 0 || len(s) < 1+width {
		return 0, fmt.Errorf("unsupported escape \\%c", s[0])
	}
	n, err := strconv.ParseUint(s[1:1+width], 16, 32)
	if err != nil || !utf8.ValidRune(rune(n)) {
		return 0, fmt.Errorf("bad escape \\%s", s[:1+width])
	}
	b.WriteRune(rune(n))
	return 1 + width, nil
}

// flowParser parses one-line flow collections: {a: b, c: [d, e]}.
type flowParser struct {
	s string
	i int
}

func (f *flowParser) skipSpace() {
	for f.i < len(f.s) && (f.s[f.i] == ' ' || f.s[f.i] == '\t') {
		f.i++
	}
}

func (f *flowParser) value() (any, error) {
	f.skipSpace()
	if f.i >= len(f.s) {
		return nil, fmt.Errorf("unterminated flow collection")
	}
	switch f.s[f.i] {
	case '{':
		return f.mapping()
	case '[':
		return f.sequence()
	case '"', '\'':
		v, n, err := quoted(f.s[f.i:])
		f.i += n
		return v, err
	case '&', '*', '!', '|', '>':
		return nil, fmt.Errorf("anchors, aliases, tags and block scalars (%c) are not supported", f.s[f.i])
	}
	start := f.i
	for f.i < len(f.s) && strings.IndexByte(",[]{}", f.s[f.i]) < 0 {
		f.i++
	}
	return plain(strings.TrimSpace(f.s[start:f.i])), nil
}

func (f *flowParser) key() (string, error) {
	f.skipSpace()
	if f.i < len(f.s) && (f.s[f.i] == '"' || f.s[f.i] == '\'') {
		k, n, err := quoted(f.s[f.i:])
		f.i += n
		return k, err
	}
	start := f.i
	for f.i < len(f.s) {
		c := f.s[f.i]
		if strings.IndexByte(",[]{}", c) >= 0 {
			break
		}
		// A colon ends a plain key only when a blank or the end of
		// the entry follows, so a URL stays one scalar.
		if c == ':' && (f.i+1 == len(f.s) || strings.IndexByte(" \t,}", f.s[f.i+1]) >= 0) {
			break
		}
		f.i++
	}
	k := strings.TrimSpace(f.s[start:f.i])
	if k == "" {
		return "", fmt.Errorf("empty key in a flow mapping")
	}
	return k, nil
}

func (f *flowParser) mapping() (any, error) {
	f.i++ // {
	out := map[string]any{}
	for {
		f.skipSpace()
		if f.i >= len(f.s) {
			return nil, fmt.Errorf("unterminated flow mapping (multi-line flow collections are not supported)")
		}
		if f.s[f.i] == '}' {
			f.i++
			return out, nil
		}
		k, err := f.key()
		if err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("key %q repeated", k)
		}
		f.skipSpace()
		var v any
		if f.i < len(f.s) && f.s[f.i] == ':' {
			f.i++
			f.skipSpace()
			if f.i < len(f.s) && f.s[f.i] != ',' && f.s[f.i] != '}' {
				if v, err = f.value(); err != nil {
					return nil, err
				}
			}
		}
		out[k] = v
		f.skipSpace()
		if f.i >= len(f.s) {
			return nil, fmt.Errorf("unterminated flow mapping (multi-line flow collections are not supported)")
		}
		switch f.s[f.i] {
		case ',':
			f.i++
		case '}':
		default:
			return nil, fmt.Errorf("want , or } in a flow mapping, got %q", f.s[f.i:])
		}
	}
}

func (f *flowParser) sequence() (any, error) {
	f.i++ // [
	out := []any{}
	for {
		f.skipSpace()
		if f.i >= len(f.s) {
			return nil, fmt.Errorf("unterminated flow sequence (multi-line flow collections are not supported)")
		}
		if f.s[f.i] == ']' {
			f.i++
			return out, nil
		}
		v, err := f.value()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		f.skipSpace()
		if f.i >= len(f.s) {
			return nil, fmt.Errorf("unterminated flow sequence (multi-line flow collections are not supported)")
		}
		switch f.s[f.i] {
		case ',':
			f.i++
		case ']':
		default:
			return nil, fmt.Errorf("want , or ] in a flow sequence, got %q", f.s[f.i:])
		}
	}
}
