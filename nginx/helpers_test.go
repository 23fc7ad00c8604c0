package nginx

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

// nginxBinary finds nginx and checks that the modules rendered configurations load
// (Lua, stream) are installed. Without them the test is skipped, except in CI, where the deps script
// installs them and a missing one is a failure.
func nginxBinary(t testing.TB) string {
	t.Helper()
	for m, pkg := range map[string]string{"ndk_http_module.so": "libnginx-mod-http-lua", "ngx_http_lua_module.so": "libnginx-mod-http-lua",
		"ngx_stream_module.so": "libnginx-mod-stream", "ngx_stream_js_module.so": "libnginx-mod-stream-js"} {
		if _, err := os.Stat(filepath.Join(DefaultOptions("").ModulesDir, m)); err != nil {
			testenv.Unavailable(t, "the nginx module %s (%s) is not installed", m, pkg)
		}
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "nginx is not installed")
	return ""
}

// nginxTest writes cfg, its table, the fallback certificate and the Lua module into dir and runs
// `nginx -t` on them, with dir as nginx's prefix, as the Reloader does.
func nginxTest(t testing.TB, dir string, cfg *Config, opt Options) {
	t.Helper()
	bin := nginxBinary(t)
	if err := prepareDirs(dir, opt); err != nil {
		t.Fatal(err)
	}
	if err := writeFallbackCertificate(resolve(dir, opt.CertDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(resolve(dir, opt.TableFile), cfg.Table.encode(cfg.Digest, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeLuaModule(dir); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, cfg.Text, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-t", "-q", "-p", dir+"/", "-c", conf, "-e", "stderr")
	cmd.Dir = dir // as Exec runs it: the control socket's path is relative
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "[warn]") {
		t.Errorf("nginx -t warns:\n%s", out)
	}
}
