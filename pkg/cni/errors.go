package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
)

// Errors for input ADD, DEL and CHECK cannot act on. Each says what was
// found and what the user can do about it; see docs/reliability/badinput.md.

// errUnreadableState is the error of a verb that needs the attachment's
// state and finds a file it cannot read: corrupt (code 6) or of another
// format version (code 6), or unreadable (code 5). DEL does not need it:
// it undoes the attachment from its arguments and removes the file.
func errUnreadableState(err error, containerID, ifName string) error {
	code := types.ErrDecodingFailure
	var pe *fs.PathError
	if errors.As(err, &pe) {
		code = types.ErrIOFailure
	}
	return types.NewError(code, fmt.Sprintf("%v; run DEL for container %s interface %s first (it cleans up from its arguments and removes the file), or remove the file", err, containerID, ifName), "")
}

// errStateDir is the error of a write into the state directory. A full
// disk or quota gets named with what to do: ADD was undone, and will work
// once there is room.
func errStateDir(dir string, err error) error {
	msg := fmt.Sprintf("state directory %s: %v", dir, err)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		msg += `; free space there or point "stateDir" at another file system, then ADD again`
	}
	return types.NewError(types.ErrIOFailure, msg, "")
}
