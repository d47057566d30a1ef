//go:build unix && !linux

package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// serverProcAttr runs the server as cred in a process group of its own, so a
// Ctrl-C in the terminal reaches playwatch only, which stops the server last.
// macOS and the BSDs have no parent-death signal: a server whose playwatch
// was killed keeps running until the next start on the data directory takes
// it over or stops it (postmaster.pid names it).
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}

// isPostmasterOf tells whether pid is a postgres server of dataDir; without
// /proc, ps(1) shows its command line.
func isPostmasterOf(pid int, dataDir string) bool {
	out, err := exec.Command("ps", "-o", "command=", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		return false
	}
	cmd := strings.TrimSpace(string(out))
	prog, _, _ := strings.Cut(cmd, " ")
	return filepath.Base(prog) == "postgres" && strings.Contains(cmd+" ", " -D "+dataDir+" ")
}
