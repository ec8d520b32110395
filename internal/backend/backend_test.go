package backend

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestValidateSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"shared_buffers", true},
		{"work_mem", true},
		{"Work_Mem", true},
		{"pg_stat_statements.max", true},
		{"auto_explain.log_min_duration", true},
		{"", false},
		{"1work_mem", false},
		{"work-mem", false},
		{"work_mem=1", false},
		{"a b", false},
		{"x.", false},
		{"port", false},
		{"listen_addresses", false},
		{"Data_Directory", false},
	} {
		err := ValidateSetting(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateSetting(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestSettingArgs(t *testing.T) {
	t.Parallel()
	got := SettingArgs(map[string]string{"work_mem": "64MB", "shared_buffers": "256MB", "application_name": "a b"})
	want := []string{"-c", "application_name=a b", "-c", "shared_buffers=256MB", "-c", "work_mem=64MB"}
	if !slices.Equal(got, want) {
		t.Errorf("SettingArgs = %q, want %q", got, want)
	}
	if SettingArgs(nil) != nil {
		t.Errorf("SettingArgs(nil) is not empty")
	}
}

func TestInitKind(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"a.sql": InitSQL, "a.sql.gz": InitSQLGz, "a.sh": InitShell,
		"a.gz": "", "a.txt": "", "README.md": "", "a.sql.xz": "",
	} {
		if got := InitKind(name); got != want {
			t.Errorf("InitKind(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestInitError(t *testing.T) {
	t.Parallel()
	var err error = &InitError{Project: "app", Script: "02-seed.sql", Message: `ERROR: relation "x" does not exist`}
	if !errors.Is(err, ErrInitFailed) {
		t.Error("an InitError does not match ErrInitFailed")
	}
	for _, want := range []string{"init script 02-seed.sql failed", `relation "x" does not exist`, "pgwake rm --volumes app", "not served"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}
