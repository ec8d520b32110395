package kubeenv

import (
	"fmt"
	"log/slog"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
)

// vkLogger is virtual-kubelet's log.Logger over slog. The library's own
// slog adapter type-asserts its first argument to string and panics on the
// errors its pod controller logs (log.G(ctx).Error(err)); this one formats
// like fmt.Sprint.
type vkLogger struct{ l *slog.Logger }

var _ vklog.Logger = vkLogger{}

func (v vkLogger) Debug(args ...any)                 { v.l.Debug(fmt.Sprint(args...)) }
func (v vkLogger) Debugf(format string, args ...any) { v.l.Debug(fmt.Sprintf(format, args...)) }
func (v vkLogger) Info(args ...any)                  { v.l.Info(fmt.Sprint(args...)) }
func (v vkLogger) Infof(format string, args ...any)  { v.l.Info(fmt.Sprintf(format, args...)) }
func (v vkLogger) Warn(args ...any)                  { v.l.Warn(fmt.Sprint(args...)) }
func (v vkLogger) Warnf(format string, args ...any)  { v.l.Warn(fmt.Sprintf(format, args...)) }
func (v vkLogger) Error(args ...any)                 { v.l.Error(fmt.Sprint(args...)) }
func (v vkLogger) Errorf(format string, args ...any) { v.l.Error(fmt.Sprintf(format, args...)) }

// Fatal logs at error level and does not exit: a library must not end the
// test binary (virtual-kubelet does not call it on these paths anyway).
func (v vkLogger) Fatal(args ...any) { v.l.Error("FATAL " + fmt.Sprint(args...)) }
func (v vkLogger) Fatalf(format string, args ...any) {
	v.l.Error("FATAL " + fmt.Sprintf(format, args...))
}

func (v vkLogger) WithField(k string, val any) vklog.Logger { return vkLogger{v.l.With(k, val)} }
func (v vkLogger) WithError(err error) vklog.Logger         { return vkLogger{v.l.With("err", err)} }
func (v vkLogger) WithFields(f vklog.Fields) vklog.Logger {
	args := make([]any, 0, 2*len(f))
	for k, val := range f {
		args = append(args, k, val)
	}
	return vkLogger{v.l.With(args...)}
}
