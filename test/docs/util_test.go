package docs

import (
	"strconv"
	"strings"
)

func itoa(i int) string     { return strconv.Itoa(i) }
func quote(s string) string { return strconv.Quote(s) }

// proseLines is a page without its fenced blocks, as prose gives it, but
// with each block's lines kept as empty lines, so that line numbers are
// the page's.
func proseLines(s string) []string {
	s = fence.ReplaceAllStringFunc(s, func(b string) string { return strings.Repeat("\n", strings.Count(b, "\n")) })
	return strings.Split(s, "\n")
}
