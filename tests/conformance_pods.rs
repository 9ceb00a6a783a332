//! Pods and logs of the conformance reproductions: agnhost's `mounttest`
//! as a busybox script, container and mount builders, what a log must show
//! ([`Want`]), and the CRI log format.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::BUSYBOX;

/// agnhost `mounttest` (test/images/agnhost/mounttest) as a busybox script:
/// run as `sh -c MOUNTTEST mounttest --flag=... ...` (upstream's args, with
/// `mounttest` as `$0`). Same flags, same order of actions, same output lines.
/// It avoids `$(...)` and `$$` (the kubelet expands `$(VAR)` in commands).
pub const MOUNTTEST: &str = r#"fs_type= file_mode= file_perm= file_owner= n644= n666= n660= n777= content= loop= retry=180 brk=true
for a in "$@"; do
  v=${a#*=}
  case "$a" in
    --fs_type=*) fs_type=$v ;;
    --file_mode=*) file_mode=$v ;;
    --file_perm=*) file_perm=$v ;;
    --file_owner=*) file_owner=$v ;;
    --new_file_0644=*) n644=$v ;;
    --new_file_0666=*) n666=$v ;;
    --new_file_0660=*) n660=$v ;;
    --new_file_0777=*) n777=$v ;;
    --file_content=*) content=$v ;;
    --file_content_in_loop=*) loop=$v ;;
    --retry_time=*) retry=$v ;;
    --break_on_expected_content=*) brk=$v ;;
  esac
done
umask 0
rc=0
initial='mount-tester new file
'
gomode() {
  m=$1 s=
  if [ "$2" = full ]; then
    t=$((m & 61440))
    [ $t -eq 16384 ] && s=${s}d
    [ $t -eq 40960 ] && s=${s}L
    [ $t -eq 24576 ] || [ $t -eq 8192 ] && s=${s}D
    [ $t -eq 4096 ] && s=${s}p
    [ $t -eq 49152 ] && s=${s}S
    [ $((m & 2048)) -ne 0 ] && s=${s}u
    [ $((m & 1024)) -ne 0 ] && s=${s}g
    [ $t -eq 8192 ] && s=${s}c
    [ $((m & 512)) -ne 0 ] && s=${s}t
  fi
  [ -n "$s" ] || s=-
  for b in 256:r 128:w 64:x 32:r 16:w 8:x 4:r 2:w 1:x; do
    if [ $((m & ${b%:*})) -ne 0 ]; then s=$s${b#*:}; else s=$s-; fi
  done
  printf '%s' "$s"
}
rawmode() { m=`stat -L -c %f "$1" 2>/dev/null` && echo $((0x$m)); }
content_of() {
  if c=`cat "$1" 2>/dev/null && echo x`; then
    printf 'content of file "%s": %s\n' "$1" "${c%x}"
  else
    printf 'error reading file content for "%s": open %s: no such file or directory\n' "$1" "$1"
    rc=1
  fi
}
if [ -n "$fs_type" ]; then
  if t=`stat -f -c %t "$fs_type" 2>/dev/null`; then
    t=$((0x$t))
    [ $t -eq 16914836 ] && t=tmpfs
    printf 'mount type of "%s": %s\n' "$fs_type" "$t"
  else
    printf 'error from statfs("%s"): no such file or directory\n' "$fs_type"; rc=1
  fi
fi
for nf in 644:$n644 666:$n666 660:$n660 777:$n777; do
  p=${nf#*:}
  [ -n "$p" ] || continue
  if printf '%s' "$initial" > "$p" && chmod "${nf%%:*}" "$p"; then
    content_of "$p"
  else
    printf 'error writing new file "%s": open %s: permission denied\n' "$p" "$p"; rc=1
  fi
done
if [ -n "$file_mode" ]; then
  if m=`rawmode "$file_mode"`; then
    printf 'mode of file "%s": %s\n' "$file_mode" "`gomode $m full`"
  else
    printf 'error from Stat("%s"): stat %s: no such file or directory\n' "$file_mode" "$file_mode"; rc=1
  fi
fi
if [ -n "$file_perm" ]; then
  if m=`rawmode "$file_perm"`; then
    printf 'perms of file "%s": %s\n' "$file_perm" "`gomode $m perm`"
  else
    printf 'error from Stat("%s"): stat %s: no such file or directory\n' "$file_perm" "$file_perm"; rc=1
  fi
fi
if [ -n "$file_owner" ]; then
  if u=`stat -L -c %u "$file_owner" 2>/dev/null`; then
    printf 'owner UID of "%s": %s\n' "$file_owner" "$u"
    printf 'owner GID of "%s": %s\n' "$file_owner" "`stat -L -c %g "$file_owner"`"
  else
    printf 'error from stat("%s"): no such file or directory\n' "$file_owner"; rc=1
  fi
fi
[ -z "$content" ] || content_of "$content"
if [ -n "$loop" ]; then
  start=`date +%s` lrc=0
  while [ $((`date +%s` - start)) -lt "$retry" ]; do
    if c=`cat "$loop" 2>/dev/null && echo x`; then
      lrc=0
      printf 'content of file "%s": %s\n' "$loop" "${c%x}"
      if [ "$brk" = true ]; then
        [ "${c%x}" = "$initial" ] && break
        printf 'Unexpected content. Expected: %s. Retrying\n' "$initial"
      fi
    else
      lrc=1
      printf 'Error reading file %s: open %s: no such file or directory, retrying\n' "$loop" "$loop"
    fi
    sleep 1
  done
  [ $lrc -eq 0 ] || rc=1
fi
exit $rc
"#;

/// A container running [`MOUNTTEST`] with upstream's `args` (without the
/// leading `mounttest`) and `volumeMounts`.
pub fn mounttest(name: &str, args: &[&str], mounts: Value) -> Value {
    let mut a = vec!["mounttest".to_string()];
    a.extend(args.iter().map(|s| s.to_string()));
    json!({
        "name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", MOUNTTEST], "args": a, "volumeMounts": mounts,
    })
}

/// A busybox container running `command`.
pub fn busybox(name: &str, command: &[&str]) -> Value {
    json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": command})
}

/// One `volumeMounts` entry.
pub fn mount(volume: &str, path: &str, read_only: bool) -> Value {
    json!({"name": volume, "mountPath": path, "readOnly": read_only})
}

/// What a container's log must show.
pub enum Want {
    /// A substring (upstream's `ContainSubstring`).
    Has(String),
    /// Some line satisfies a predicate (upstream's regular expressions).
    Line(String, fn(&str) -> bool),
}

impl Want {
    /// A substring.
    pub fn has(s: impl Into<String>) -> Want {
        Want::Has(s.into())
    }

    pub(crate) fn holds(&self, log: &str) -> bool {
        match self {
            Want::Has(s) => log.contains(s.as_str()),
            Want::Line(_, p) => log.lines().any(p),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Want::Has(s) => format!("{s:?}"),
            Want::Line(d, _) => format!("a line matching {d}"),
        }
    }
}

/// Upstream's `getFileModeRegex` on Linux: `mode of file "<path>": <mode>`.
pub fn file_mode(path: &str, mode: &str) -> Want {
    Want::has(format!("mode of file \"{path}\": {mode}"))
}

/// Mount points at or under `root` (from /proc/self/mountinfo).
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(root))
        .collect()
}

/// A CRI log file (`<time> <stream> <P|F> <text>` lines) as the log text.
pub fn parse_cri_log(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    for line in text.split('\n').filter(|l| !l.is_empty()) {
        let mut it = line.splitn(4, ' ');
        let (_ts, _stream, tag) = (it.next(), it.next(), it.next());
        out.push_str(it.next().unwrap_or(""));
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}

/// Phase predicates for [`Suite::wait_all`].
pub fn terminal(phase: &str) -> bool {
    matches!(phase, "Succeeded" | "Failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_lines_are_joined() {
        let raw = b"2024-01-01T00:00:00Z stdout P abc\n2024-01-01T00:00:00Z stdout F def\n2024-01-01T00:00:00Z stderr F \n";
        assert_eq!(parse_cri_log(raw), "abcdef\n\n");
    }

    /// Runs [`MOUNTTEST`] with the host's `sh` and `stat` (busybox's take the
    /// same options): its output, and whether it exited 0.
    fn run(args: &[&str]) -> (String, bool) {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(MOUNTTEST)
            .arg("mounttest")
            .args(args)
            .output()
            .expect("sh");
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            out.status.success(),
        )
    }

    #[test]
    fn mounttest_prints_what_agnhost_prints() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path().join("vol");
        std::fs::create_dir(&d).expect("dir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o3777)).expect("chmod");
        let f = d.join("..data-1");
        std::fs::write(&f, "value-1\n").expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        symlink("..data-1", d.join("data-1")).expect("symlink");
        let (d, l, n) = (
            d.display().to_string(),
            d.join("data-1").display().to_string(),
            d.join("new").display().to_string(),
        );

        let (out, ok) = run(&[
            "--fs_type=/proc",
            &format!("--new_file_0660={n}"),
            &format!("--file_mode={d}"),
            &format!("--file_perm={n}"),
            &format!("--file_owner={n}"),
            &format!("--file_content={l}"),
        ]);
        assert!(ok, "{out}");
        // Go: os.FileMode.String() (setgid, sticky), Perm(), the proc magic in decimal.
        let uid = std::fs::metadata(&n)
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .expect("uid");
        let gid = std::fs::metadata(&n)
            .map(|m| std::os::unix::fs::MetadataExt::gid(&m))
            .expect("gid");
        let want = format!(
            "mount type of \"/proc\": 40864\n\
             content of file \"{n}\": mount-tester new file\n\n\
             mode of file \"{d}\": dgtrwxrwxrwx\n\
             perms of file \"{n}\": -rw-rw----\n\
             owner UID of \"{n}\": {uid}\n\
             owner GID of \"{n}\": {gid}\n\
             content of file \"{l}\": value-1\n\n"
        );
        assert_eq!(out, want);
        let (out, ok) = run(&[&format!("--file_mode={l}")]);
        assert!(ok);
        assert_eq!(
            out,
            format!("mode of file \"{l}\": -r--------\n"),
            "the link is followed"
        );

        let missing = format!("{d}/missing");
        let (out, ok) = run(&[&format!("--file_content={missing}")]);
        assert!(!ok, "a failed read exits 1");
        assert!(
            out.starts_with(&format!("error reading file content for \"{missing}\"")),
            "{out}"
        );
        let (out, ok) = run(&[
            &format!("--file_content_in_loop={missing}"),
            "--retry_time=1",
            "--break_on_expected_content=false",
        ]);
        assert!(!ok);
        assert!(
            out.starts_with(&format!("Error reading file {missing}: "))
                && out.contains(", retrying\n"),
            "{out}"
        );
    }
}
