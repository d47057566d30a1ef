package main

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
)

// Code that runs over outside input (a review's text, a store page, a
// capture file) recovers its panics where one input is handled, so that a
// bug one input sets off fails that input alone, never the process (which,
// restarted, would meet the same input again).

// panicError is a recovered panic: its value and where it was raised.
type panicError struct {
	value any
	site  string // file:line (function) of the panicking code, "" if unknown
}

func (e *panicError) Error() string {
	if e.site == "" {
		return fmt.Sprintf("panic: %v", e.value)
	}
	return fmt.Sprintf("panic at %s: %v", e.site, e.value)
}

// recoveredPanic wraps v, the value recover returned; call it in the
// deferred function itself, so that the stack still holds the panic's site.
func recoveredPanic(v any) *panicError {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	panicking := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			panicking = true
		case panicking && !strings.HasPrefix(f.Function, "runtime."):
			fn := f.Function[strings.LastIndexByte(f.Function, '/')+1:]
			return &panicError{value: v, site: fmt.Sprintf("%s:%d (%s)", filepath.Base(f.File), f.Line, fn)}
		}
		if !more {
			return &panicError{value: v}
		}
	}
}
