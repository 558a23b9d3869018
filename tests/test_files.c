/* Files and bytes from outside: SHA-256 and HMAC against the standards'
   vectors, the HOSTIR_* switches, and the kernel cache's directory and
   entries as a careless or hostile user leaves them (a shared or foreign
   directory, a link, a FIFO, a huge, truncated or altered entry, umask 0),
   driven through the cache's own functions, no GPU needed. */
#include "test.h"
#include <sys/stat.h>
#include <unistd.h>

static void hex_of(const unsigned char *d, int n, char *out) {
  int i;
  for (i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

TEST(test_files_sha256, "files/sha256_hmac_vectors", TEST_CPU) {
  unsigned char d[32], key[131];
  char hex[65], *million = (char *)malloc(1000000);
  hir_sha256 s;
  size_t i;
  hir_sha256_init(&s);
  hir_sha256_update(&s, "abc", 3);
  hir_sha256_final(&s, d);
  hex_of(d, 32, hex);
  CHECK_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  hir_sha256_init(&s);
  hir_sha256_final(&s, d);
  hex_of(d, 32, hex);
  CHECK_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  hir_sha256_init(&s); /* 56 bytes: the padding spills into a second block */
  hir_sha256_update(&s, "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56);
  hir_sha256_final(&s, d);
  hex_of(d, 32, hex);
  CHECK_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  if (million) { /* a million 'a', fed in uneven pieces */
    memset(million, 'a', 1000000);
    hir_sha256_init(&s);
    for (i = 0; i < 1000000; i += 777) hir_sha256_update(&s, million + i, i + 777 > 1000000 ? 1000000 - i : 777);
    hir_sha256_final(&s, d);
    hex_of(d, 32, hex);
    CHECK_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
  free(million);
  memset(key, 0x0b, 20); /* RFC 4231, cases 1 and 6 (a key longer than a block) */
  hir_hmac_sha256(key, 20, "Hi There", 8, d);
  hex_of(d, 32, hex);
  CHECK_STR(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  memset(key, 0xaa, 131);
  hir_hmac_sha256(key, 131, "Test Using Larger Than Block-Size Key - Hash Key First", 54, d);
  hex_of(d, 32, hex);
  CHECK_STR(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(test_files_env_switch, "files/env_switch", TEST_CPU) {
  static const char *const on[] = {"1", "on", "ON", "True", "true"}, *const off[] = {"0", "off", "Off", "FALSE"},
                           *const bad[] = {"", "yes", "2", "onn", " 1", "o"};
  char err[200];
  int v, i;
  unsetenv("HOSTIR_TEST_SWITCH");
  CHECK(hir_env_switch("HOSTIR_TEST_SWITCH", 1, &v, err, sizeof err) == HIR_OK && v == 1);
  CHECK(hir_env_switch("HOSTIR_TEST_SWITCH", 0, &v, err, sizeof err) == HIR_OK && v == 0);
  for (i = 0; i < 5; i++) {
    setenv("HOSTIR_TEST_SWITCH", on[i], 1);
    CHECK(hir_env_switch("HOSTIR_TEST_SWITCH", 0, &v, err, sizeof err) == HIR_OK && v == 1);
  }
  for (i = 0; i < 4; i++) {
    setenv("HOSTIR_TEST_SWITCH", off[i], 1);
    CHECK(hir_env_switch("HOSTIR_TEST_SWITCH", 1, &v, err, sizeof err) == HIR_OK && v == 0);
  }
  for (i = 0; i < 6; i++) {
    setenv("HOSTIR_TEST_SWITCH", bad[i], 1);
    err[0] = 0;
    CHECK(hir_env_switch("HOSTIR_TEST_SWITCH", 1, &v, err, sizeof err) == HIR_ERR_INVALID && v == 1 &&
          strstr(err, "HOSTIR_TEST_SWITCH is") && strstr(err, "0, 1, on, off, true or false"));
  }
  unsetenv("HOSTIR_TEST_SWITCH");
}

/* The cache at `dir` opened; returns its dirfd (-1: refused, why in kc). */
static int kcache_at(hir__kcache *kc, const char *dir) {
  setenv("HOSTIR_CACHE_DIR", dir, 1);
  hir__kcache_open(kc);
  return kc->dirfd;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f) fwrite(data, 1, n, f), fclose(f);
}

TEST(test_files_kernel_cache, "files/kernel_cache", TEST_CPU) {
  char root[] = "/tmp/hostir_kcache_XXXXXX", dir[256], name[80], entry[400], other[400], *old = getenv("HOSTIR_CACHE_DIR");
  char saved[4096] = "", bin[3000], *got, *big;
  unsigned char key[32], key2[32];
  size_t size = 0, i;
  hir__kcache kc;
  struct stat st;
  mode_t mask;
  FILE *f;
  if (old) snprintf(saved, sizeof saved, "%s", old);
  if (!mkdtemp(root)) {
    CHECK(!"mkdtemp");
    return;
  }
  for (i = 0; i < sizeof bin; i++) bin[i] = (char)(rand() & 0xff);
  hir__kcache_key("__global__ void k() {}", "--gpu-architecture=sm_90 --std=c++14", "sm_90", key);
  hir__kcache_key("__global__ void k() {}", "--gpu-architecture=sm_90 --std=c++17", "sm_90", key2);
  CHECK(memcmp(key, key2, 32) != 0); /* the options are in the key */
  hir__kcache_name(key, "sm_90", name, sizeof name);

  /* made 0700 under umask 0; an entry written 0600, read back whole */
  snprintf(dir, sizeof dir, "%s/cache", root);
  snprintf(entry, sizeof entry, "%s/%s", dir, name);
  mask = umask(0);
  CHECK(kcache_at(&kc, dir) >= 0 && stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);
  hir__kcache_put(&kc, key, "sm_90", 13000, bin, sizeof bin);
  umask(mask);
  CHECK(stat(entry, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == (off_t)(sizeof bin + HIR__KCACHE_HEADER));
  got = hir__kcache_get(&kc, key, "sm_90", 13000, &size);
  CHECK(got && size == sizeof bin && !memcmp(got, bin, size));
  free(got);
  got = hir__kcache_get(&kc, key, "sm_90", 0, &size); /* NVRTC's version unknown: taken */
  CHECK(got != NULL);
  free(got);
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13001, &size) && strstr(kc.why, "another hostir or NVRTC")); /* another NVRTC */
  CHECK(!hir__kcache_get(&kc, key2, "sm_90", 13000, &size)); /* another key: no entry */
  CHECK(!hir__kcache_get(&kc, key, "sm_100", 13000, &size));

  /* truncated, then altered: refused, and a put replaces it */
  CHECK(truncate(entry, HIR__KCACHE_HEADER + 100) == 0);
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "refused") && strstr(kc.why, name));
  hir__kcache_put(&kc, key, "sm_90", 13000, bin, sizeof bin);
  if ((f = fopen(entry, "r+b"))) fseek(f, HIR__KCACHE_HEADER + 1234, SEEK_SET), fputc(bin[1234] ^ 1, f), fclose(f);
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "do not match"));
  write_bytes(entry, bin, 100); /* shorter than a header */
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "shorter than its header"));
  write_bytes(entry, bin, sizeof bin); /* not ours */
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "not a hostir cache entry"));

  /* a link at the entry: not followed on read; the write replaces the link, not its target */
  snprintf(other, sizeof other, "%s/victim", root);
  write_bytes(other, "precious", 8);
  chmod(other, 0600);
  unlink(entry);
  CHECK(symlink(other, entry) == 0);
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "symbolic link"));
  hir__kcache_put(&kc, key, "sm_90", 13000, bin, sizeof bin);
  CHECK(lstat(entry, &st) == 0 && S_ISREG(st.st_mode) && stat(other, &st) == 0 && st.st_size == 8);
  got = hir__kcache_get(&kc, key, "sm_90", 13000, &size);
  CHECK(got && size == sizeof bin);
  free(got);

  /* a FIFO: refused at once (no read blocks) */
  unlink(entry);
  CHECK(mkfifo(entry, 0600) == 0);
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "not a regular file"));
  unlink(entry);

  /* 3 GiB (sparse): refused by its size, not read */
  if ((f = fopen(entry, "wb"))) fclose(f);
  CHECK(truncate(entry, (off_t)3 << 30) == 0);
  CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "more than"));
  unlink(entry);

  /* another user's entry, and directory (root can make them so) */
  hir__kcache_put(&kc, key, "sm_90", 13000, bin, sizeof bin);
  if (geteuid() == 0 && chown(entry, 12345, 12345) == 0)
    CHECK(!hir__kcache_get(&kc, key, "sm_90", 13000, &size) && strstr(kc.why, "owned by another user"));
  hir__kcache_close(&kc);
  if (geteuid() == 0 && chown(dir, 12345, 12345) == 0)
    CHECK(kcache_at(&kc, dir) < 0 && strstr(kc.why, "owned by another user") && strstr(kc.why, "not used"));
  hir__kcache_close(&kc);

  /* a directory others may write: refused, with what to do */
  snprintf(dir, sizeof dir, "%s/shared", root);
  mkdir(dir, 0700);
  chmod(dir, 0777);
  CHECK(kcache_at(&kc, dir) < 0 && strstr(kc.why, "writable by group or others") && strstr(kc.why, "chmod 700"));
  hir__kcache_close(&kc);
  chmod(dir, 0770);
  CHECK(kcache_at(&kc, dir) < 0);
  hir__kcache_close(&kc);

  /* a link as the directory: refused */
  snprintf(other, sizeof other, "%s/cache_link", root);
  snprintf(dir, sizeof dir, "%s/own", root);
  mkdir(dir, 0700);
  CHECK(symlink(dir, other) == 0 && kcache_at(&kc, other) < 0 && strstr(kc.why, "symbolic link"));
  hir__kcache_close(&kc);

  /* off in any case, and a name longer than a path */
  CHECK(kcache_at(&kc, "OFF") < 0 && !kc.why[0]);
  CHECK(kcache_at(&kc, "Off") < 0 && !kc.why[0]);
  if ((big = (char *)malloc(5000))) {
    memset(big, 'a', 4999);
    big[0] = '/', big[4999] = 0;
    CHECK(kcache_at(&kc, big) < 0 && strstr(kc.why, "HOSTIR_CACHE_DIR is 4999 characters"));
    free(big);
  }
  if (saved[0]) setenv("HOSTIR_CACHE_DIR", saved, 1);
  else unsetenv("HOSTIR_CACHE_DIR");
  snprintf(dir, sizeof dir, "rm -rf '%s'", root);
  CHECK(system(dir) == 0);
}
