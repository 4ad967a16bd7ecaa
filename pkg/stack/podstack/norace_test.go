//go:build !race

package podstack

const raceEnabled = false
