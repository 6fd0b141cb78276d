"""classify: what each writing program writes, read from
its options exactly (which options take a value, which word is the target, which options run a
program), for the copy and move tools, the permission tools, find's output files, the service
managers, init, sysctl, curl, wget, tar, unzip, 7-Zip and sed; and where a command runs or reads.

A row names a command and the judgement it must get: the level, every reason, and whether the
sandbox may run its first step. Most rows put an outside path (/etc/x) where a slip would move
it between "written" and only "named", so an option's value taken for an operand (or the other
way round) changes the reasons. Rows with a letter the program does not have (cp -X) pin that
an unknown letter takes no value."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, analyze


def _judged(cmd: str, root: Path) -> tuple:
    a = analyze(cmd, root)
    return a.level, a.reasons(), a.steps[0].coverable


# Each row was reasoned through against the program's manual (GNU coreutils, rsync, GNU tar,
# curl, GNU wget, 7-Zip, GNU sed). Notable ones:
# - chmod's mode may start with a dash (-x, -w,o+r): it is the mode, so the next word is a file
#   that changes (it was taken for an option, and `chmod -x /etc/x` only named /etc/x);
# - tar -F (--info-script) runs a program; -g (--listed-incremental) rewrites its snapshot file;
#   every GNU value letter takes its value, except -H and -L, which bsdtar reads as flags;
# - curl -K and wget -e/--config read more options that can set where they write: not checked;
# - curl's --hsts and --alt-svc caches are written back;
# - 7-Zip's output directory is -oDIR, attached; a, u, d and rn rewrite the archive;
# - rc-service names the service first, like service (rc-service x status only reads);
# - `chmod 644 *` counts .git among the matches: `shopt -s dotglob` passes as harmless, so a
#   written pattern's hidden matches are judged (asks more than bash without dotglob would do).
WRITE_CASES = [
    ('cd .git && ls', SAFE, ['runs cd', 'runs ls'], True),
    ('cd .git/refs; cat x', SAFE, ['runs cd', 'runs cat'], True),
    ('cat <>/etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)'], False),
    ('cat < $AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', ORDINARY, ['reads a computed path ($AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA)'], False),
    ('cat < /dev/sda', ORDINARY, ['reads a file outside the workspace (/dev/sda)'], False),
    ('cat < /dev/tty', SAFE, ['runs cat'], True),
    ('scp a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('scp a b', ORDINARY, ['runs scp'], True),
    ('scp x /etc/a:b', DANGEROUS, ['writes outside the workspace (/etc/a:b)', 'names a path outside the workspace (/etc/a:b)'], False),
    ('rsync x /etc/a:b', DANGEROUS, ['writes outside the workspace (/etc/a:b)', 'names a path outside the workspace (/etc/a:b)'], False),
    ('scp a h:x', ORDINARY, ['runs scp'], True),
    ('cp -X a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync -X a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync a b -T /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cp a b -T /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('cp a b -S /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cp a b -m /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rsync a b -e /etc/x', ORDINARY, ['rsync runs a remote shell command', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync a b -f /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cp --target-directory /etc a', DANGEROUS, ['writes outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('cp a b --suffix /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('install a b --mode /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rsync a b --rsh /etc/x', ORDINARY, ['rsync runs a remote shell command', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync a b --filter /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rsync a b --exclude /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rsync a b --include /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rsync a b --temp-dir /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('install -d a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('install a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('cp -d /etc/x b', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('ln -d /etc/x b', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rsync --remove-source-files /etc/x b', DANGEROUS, ['deletes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync --delete a b', DANGEROUS, ['rsync --delete removes files'], True),
    ('mv -X a /etc/x', DANGEROUS, ['moves outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('mv a b --suffix /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('mv a b -S /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('mv -t /etc a', DANGEROUS, ['moves outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('chmod -x .git/config', DANGEROUS, ['changes inside .git (.git/config)', 'chmod is given a path inside .git (.git/config)'], False),
    ('chmod -x /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chmod -w,o+r /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chmod -R -x src', DANGEROUS, ['recursive permission or owner change'], True),
    ('chmod -x src/app.py', ORDINARY, ['runs chmod'], True),
    ('chmod -v 644 /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chmod --reference=src/app.py /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chown --from root /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('chown --from=root /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('setfacl -m /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('setfacl -M /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('setfacl -x /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('setfacl -X /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('chattr +i /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chattr -R +i src', DANGEROUS, ['recursive permission or owner change'], True),
    ('chflags -R x src', DANGEROUS, ['recursive permission or owner change'], True),
    ('chflags x /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('find . -fprint /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('find . -fprint0 /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('find . -fprintf /etc/x %p', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('find . -fls /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('find . -fprint', ORDINARY, ['runs find'], True),
    ('initctl restart x', DANGEROUS, ['initctl: changes system services'], True),
    ('initctl status x', ORDINARY, ['runs initctl'], True),
    ('rc-service x restart', DANGEROUS, ['rc-service: changes system services'], True),
    ('rc-service x status', ORDINARY, ['runs rc-service'], True),
    ('sv restart x', DANGEROUS, ['sv: changes system services'], True),
    ('sv status x', ORDINARY, ['runs sv'], True),
    ('service x', DANGEROUS, ['service: changes system services'], True),
    ('service x status', ORDINARY, ['runs service'], True),
    ('systemctl -H status restart x', DANGEROUS, ['systemctl: changes system services'], True),
    ('systemctl -M status restart x', DANGEROUS, ['systemctl: changes system services'], True),
    ('systemctl --host status restart x', DANGEROUS, ['systemctl: changes system services'], True),
    ('systemctl --machine status restart x', DANGEROUS, ['systemctl: changes system services'], True),
    ('sysctl x=1', DANGEROUS, ['changes kernel settings'], True),
    ('sysctl -w x', DANGEROUS, ['changes kernel settings'], True),
    ('sysctl --write x', DANGEROUS, ['changes kernel settings'], True),
    ('sysctl -p', DANGEROUS, ['changes kernel settings'], True),
    ('sysctl --load x', DANGEROUS, ['changes kernel settings'], True),
    ('sysctl -n x', ORDINARY, ['runs sysctl'], True),
    ('curl --hsts /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --alt-svc /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl -o /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --trace-ascii /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --libcurl /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget -O /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -xf a.tar -C /etc', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('bsdtar -xf a.tar -C /etc', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('gtar -xf a.tar -C /etc', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('tar -cf /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -c --file /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -c --file=/etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -x --directory /etc -f a.tar', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('tar -xf a.tar --to-command sh', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -xf a.tar --checkpoint-action exec=sh', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -cf a.tar --info-script x.sh src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -cf a.tar --new-volume-script x.sh src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -cf a.tar --rsh-command x.sh src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -cf a.tar -I x.sh src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -cf a.tar --use-compress-program x.sh src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -F x.sh -cf a.tar src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar cFf x.sh a.tar src', UNKNOWN, ['tar runs a program given in its options'], False),
    ('tar -cg /etc/snap -f a.tar src', DANGEROUS, ['writes outside the workspace (/etc/snap)', 'names a path outside the workspace (/etc/snap)'], False),
    ('tar -c --listed-incremental /etc/snap -f a.tar src', DANGEROUS, ['writes outside the workspace (/etc/snap)', 'names a path outside the workspace (/etc/snap)'], False),
    ('tar -c --listed-incremental=/etc/snap -f a.tar src', DANGEROUS, ['writes outside the workspace (/etc/snap)', 'names a path outside the workspace (/etc/snap)'], False),
    ('tar -cXf /etc/x src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -X /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c --exclude-from /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -L -f /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -c -H /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -b /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -K /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -N /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -V /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c -T /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar -c --files-from /etc/x -f a.tar src', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('tar cf /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar xfC a.tar /etc', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('tar -rf /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -uf /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -Af /etc/x b.tar', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar --delete -f /etc/x y', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar --append -f /etc/x src', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -tf /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('rc-service x stop', DANGEROUS, ['rc-service: changes system services'], True),
    ('rc-service --ifstarted x status', ORDINARY, ['runs rc-service'], True),
    ('install -d /etc/x a', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('mv a b -X /etc/x', DANGEROUS, ['moves outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('mv --target-directory /etc a', DANGEROUS, ['moves outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    # (setfacl's ACL is -m's value: /etc/x is the file whose ACL changes; eighth round)
    ('setfacl -m u:x:r /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('unzip a.zip -d /etc', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('unzip a.zip -X -d /etc', DANGEROUS, ['extracts into outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('7z x a.7z -o/etc', DANGEROUS, ['extracts into outside the workspace (/etc)'], False),
    ('7za e a.7z -o/etc', DANGEROUS, ['extracts into outside the workspace (/etc)'], False),
    ('7zr x a.7z -o/etc', DANGEROUS, ['extracts into outside the workspace (/etc)'], False),
    ('7z x a.7z -o$D', UNKNOWN, ['extracts into a computed path (-o$D)'], True),
    ('7z x a.7z', ORDINARY, ['runs 7z'], True),
    ('7z a /etc/x.7z src', DANGEROUS, ['writes outside the workspace (/etc/x.7z)', 'names a path outside the workspace (/etc/x.7z)'], False),
    ('7z u /etc/x.7z src', DANGEROUS, ['writes outside the workspace (/etc/x.7z)', 'names a path outside the workspace (/etc/x.7z)'], False),
    ('7z d /etc/x.7z y', DANGEROUS, ['writes outside the workspace (/etc/x.7z)', 'names a path outside the workspace (/etc/x.7z)'], False),
    ('7z rn /etc/x.7z a b', DANGEROUS, ['writes outside the workspace (/etc/x.7z)', 'names a path outside the workspace (/etc/x.7z)'], False),
    ('7z l /etc/a.7z', ORDINARY, ['names a path outside the workspace (/etc/a.7z)'], False),
    ('7z x -p/etc/x a.7z', ORDINARY, ['runs 7z'], True),
    ('wget -e output_document=/etc/x u', UNKNOWN, ['wget runs wgetrc commands given in its options, which are not checked'], False),
    ('wget --execute robots=off u', UNKNOWN, ['wget runs wgetrc commands given in its options, which are not checked'], False),
    ('wget --config /etc/x u', UNKNOWN, ['wget runs wgetrc commands given in its options, which are not checked', 'names a path outside the workspace (/etc/x)'], False),
    ('wget u -X -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -I -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -D -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -A -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -R -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -t -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -T -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -w -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -Q -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -B -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -i -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -U -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -l -O /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('wget u -N -O /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget --output-document /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget -o /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget --output-file /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget -a /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget --append-output /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('wget -P /etc u', DANGEROUS, ['writes outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('wget --directory-prefix /etc u', DANGEROUS, ['writes outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('curl --output /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --dump-header /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl -D /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl -c /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --cookie-jar /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --trace /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --output-dir /etc u', DANGEROUS, ['writes outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('curl --stderr /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --etag-save /etc/x u', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl -K /etc/x u', UNKNOWN, ['curl reads options from a file, which are not checked', 'names a path outside the workspace (/etc/x)'], False),
    ('curl -T /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -u -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -X -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -H -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -e -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -E -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -b -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -r -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -w -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -x -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -A -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -F -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -y -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -Y -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -z -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -d -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u -s -o /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('gsed -i s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)', 'gsed is given a path inside .git (.git/config)'], False),
    ('sed -i -X s/x/y/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed --expression s/a/b/ -i .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed -i --file x.sed .git/config', DANGEROUS, ['sed runs a script from a file, which is not checked', 'edits inside .git (.git/config)'], False),
    ('sed --line-length 80 -i s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed -l 80 -i s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed --file x.sed a', UNKNOWN, ['sed runs a script from a file, which is not checked'], False),
    ('sed -f x.sed a', UNKNOWN, ['sed runs a script from a file, which is not checked'], False),
    ("sed 'e ls' x", UNKNOWN, ['the sed script may run commands or write files (e, w, r ...)'], False),
    ("sed 'w /etc/x' a", UNKNOWN, ['the sed script may run commands or write files (e, w, r ...)'], False),
    ('sed -i -e s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed -i s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed -i -f x.sed .git/config', DANGEROUS, ['sed runs a script from a file, which is not checked', 'edits inside .git (.git/config)'], False),
    ('sed -i --file=x.sed .git/config', DANGEROUS, ['sed runs a script from a file, which is not checked', 'edits inside .git (.git/config)'], False),
    ('sed -i --expression=s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed --in-place s/a/b/ .git/config', DANGEROUS, ['edits inside .git (.git/config)'], False),
    ('sed -n p .git/config', SAFE, ['runs sed'], True),
    ('tee /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tee out.txt', ORDINARY, ['runs tee'], True),
    ('cp -S /etc/x a b', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('install a b -m /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cp -t /etc a', DANGEROUS, ['writes outside the workspace (/etc)', 'names a path outside the workspace (/etc)'], False),
    ('mv a /etc/x', DANGEROUS, ['moves outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync --rsh=ssh a b', ORDINARY, ['rsync runs a remote shell command'], False),
    ('rsync -e ssh a b', ORDINARY, ['rsync runs a remote shell command'], False),
    ('rsync -av a b', ORDINARY, ['runs rsync'], True),
    ('scp a h:/.git/config', UNKNOWN, ['scp is given a path inside .git (h:/.git/config)'], False),
    ('scp h:x a', ORDINARY, ['runs scp'], True),
    ('rsync h:x /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('scp /etc/x h:y', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cp a h:/etc/x', ORDINARY, ['runs cp'], True),
    ('install -d /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('install -D a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('install -m 644 a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('ln -s a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('ln -s /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cp -d a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync --delete /etc/x b', DANGEROUS, ['deletes outside the workspace (/etc/x)', 'rsync --delete removes files', 'names a path outside the workspace (/etc/x)'], False),
    ('rsync --remove-source-files a b', ORDINARY, ['runs rsync'], True),
    ('cp --recursive /etc/x b', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('dd if=/etc/x of=out', ORDINARY, ['runs dd'], True),
    ('dd of=/etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)'], False),
    ('dd if=a of=$X', UNKNOWN, ['dd with computed operands'], True),
    ('chmod 644 /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chmod -R 644 src', DANGEROUS, ['recursive permission or owner change'], True),
    ('chmod --recursive 644 src', DANGEROUS, ['recursive permission or owner change'], True),
    ('chown root /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chown --reference /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('chown --reference=/etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('chown --from root a /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('chmod --reference /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('chgrp g /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('setfacl -R -m u:x:r src', DANGEROUS, ['recursive permission or owner change'], True),
    ('chmod 644 *', DANGEROUS, ['chmod *: the pattern may match file names that read as options', 'changes inside .git (*)'], False),
    ('chmod 644 -- *', DANGEROUS, ['changes inside .git (*)'], False),
    ('chmod $M a', UNKNOWN, ['chmod with arguments the shell computes ($M), which may be options'], True),
    ('find . -name x -fprint', ORDINARY, ['runs find'], True),
    ('find . -fls', ORDINARY, ['runs find'], True),
    ('systemctl status x', ORDINARY, ['runs systemctl'], True),
    ('systemctl restart x', DANGEROUS, ['systemctl: changes system services'], True),
    ('service x restart', DANGEROUS, ['service: changes system services'], True),
    ('launchctl list', ORDINARY, ['runs launchctl'], True),
    ('launchctl load x', DANGEROUS, ['launchctl: changes system services'], True),
    ('systemctl -H host restart x', DANGEROUS, ['systemctl: changes system services'], True),
    ('systemctl $X', UNKNOWN, ['systemctl with a computed action'], True),
    ('systemctl', DANGEROUS, ['systemctl: changes system services'], True),
    ('init 0', DANGEROUS, ['init: stops the machine'], True),
    ('init 6', DANGEROUS, ['init: stops the machine'], True),
    ('init 1', DANGEROUS, ['init: stops the machine'], True),
    ('init s', DANGEROUS, ['init: stops the machine'], True),
    ('init S', DANGEROUS, ['init: stops the machine'], True),
    ('init 3', ORDINARY, ['runs init'], True),
    ('init', ORDINARY, ['runs init'], True),
    ('sysctl -a', ORDINARY, ['runs sysctl'], True),
    ('curl --config /etc/x u', UNKNOWN, ['curl reads options from a file, which are not checked', 'names a path outside the workspace (/etc/x)'], False),
    ('curl --upload-file /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -u /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -X /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -H /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -e /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -E /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -b /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -r /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -w /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -x /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -A /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -F /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -y /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -Y /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -z /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl -d /etc/x u', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('curl u', ORDINARY, ['runs curl'], True),
    ('wget u', ORDINARY, ['runs wget'], True),
    # An option that takes a value takes the next word even when it starts with a dash.
    ("sed --expression p --expression 'w /etc/x' a", UNKNOWN, ['the sed script may run commands or write files (e, w, r ...)'], False),
    ('sed -i -e p --file /etc/x a', UNKNOWN, ['sed runs a script from a file, which is not checked', 'names a path outside the workspace (/etc/x)'], False),
    ('curl u --upload-file -o /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('mv a b --target-directory -S /etc/x', DANGEROUS, ['moves outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", WRITE_CASES, ids=[c[0] for c in WRITE_CASES])
def test_what_each_writer_writes(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


def test_a_remote_operand_is_not_a_local_write(root: Path, tmp_path: Path) -> None:
    # Slip: rsync's or scp's host:path taken for a local name (or a colon after the first slash
    # taken for a host). Locally, `h:/x` is the file x in a directory named "h:", here a link out
    # of the workspace: cp writes there, rsync and scp send to the host h and only name it.
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", root / "h:")
    far = f"{root}/h:/x"
    named = (ORDINARY, [f"names a path outside the workspace ({far})"], False)
    assert _judged("rsync a h:/x", root) == named
    assert _judged("scp a h:/x", root) == named
    assert _judged("cp a h:/x", root) == (DANGEROUS, [f"writes outside the workspace ({far})",
                                                      f"names a path outside the workspace ({far})"], False)
    # A colon after the first slash is a local name: written, for both.
    for prog in ("rsync", "scp"):
        assert _judged(f"{prog} a /etc/a:b", root)[1][0] == "writes outside the workspace (/etc/a:b)"


@pytest.mark.parametrize("where", ["inside", "git", "tmp", "outside"])
def test_a_read_only_program_found_where_commands_may_write_is_not_read_only(root: Path, tmp_path: Path,
                                                                              where: str) -> None:
    # Slip: one of the places the sandbox lets commands write dropped from _resolves_safely. A
    # `cat` that PATH finds in the workspace, in its .git or in a temporary folder may have been
    # written by an earlier command: running it is running that file.
    from ds4agent.tools.classify import Places

    d = {"inside": root / "bin", "git": root / ".git" / "bin", "tmp": tmp_path / "scratch",
         "outside": tmp_path / "usr" / "bin"}[where]
    d.mkdir(parents=True)
    (d / "cat").write_text("#!/bin/sh\n")
    (d / "cat").chmod(0o755)
    places = Places.for_root(root, tmp=((tmp_path / "scratch").resolve(),))
    a = analyze("cat src/app.py", root, places=places, env={"PATH": str(d)})
    assert (a.level, a.reasons(), a.steps[0].coverable) == (SAFE if where == "outside" else ORDINARY, ["runs cat"], True)


# Where a command runs and what it names or reads, the read-only list's own checks (find's
# writing actions, date's clock setting, uniq's and xxd's output operand, env, awk's options),
# and git's creating subcommands. Notable rows:
# - `uniq - b` writes b: "-" is stdin as the input, the second operand is still the output
#   (it was not counted, so the command passed as read-only); uniq's and xxd's output is now
#   judged as a write, with their value options (-f 1 is no output file);
# - `date -I 0101` sets the clock: -I takes its format attached only;
# - `env -u X` only prints: what env runs becomes a step of its own.
READ_CASES = [
    ('cd src && cat ../src/app.py', SAFE, ['runs cd', 'runs cat'], True),
    ('cd $D && cat /etc/x', ORDINARY, ['runs in a directory the shell computes', 'names a path outside the workspace (/etc/x)'], True),
    ('cd $D && echo x > /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)'], True),
    ('cd $D && foo ../x', ORDINARY, ['runs in a directory the shell computes', 'names ../x in a directory the shell computes'], True),
    ('cat -x/../../etc/passwd', SAFE, ['runs cat'], True),
    ('foo .git/config', UNKNOWN, ['foo is given a path inside .git (.git/config)'], False),
    ('foo src/.git/x', UNKNOWN, ['foo is given a path inside .git (src/.git/x)'], False),
    ('foo -o/etc/x', ORDINARY, ['runs foo'], True),
    ('foo --out=/etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('git diff .git/config', SAFE, ['runs git'], True),
    ('echo x > */config', DANGEROUS, ['writes inside .git (*/config)'], False),
    ('ls -XL src', ORDINARY, ['runs ls'], True),
    ('ls -X -L .', ORDINARY, ['runs ls'], True),
    ('ls --ignore=/etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('ls --ignore=/etc/a=b', ORDINARY, ['names a path outside the workspace (/etc/a=b)'], False),
    ('ls --ignore= /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('ls; shopt -s extdebug', ORDINARY, ['runs ls', 'shopt changes how the shell reads what follows'], True),
    ('find . -fprint out.txt', ORDINARY, ['runs find'], True),
    ('find . -fprint0 out.txt', ORDINARY, ['runs find'], True),
    ('find . -fprintf out.txt %p', ORDINARY, ['runs find'], True),
    ('find . -fls out.txt', ORDINARY, ['runs find'], True),
    ('find . -okdir ls {} \\;', ORDINARY, ['runs find', 'runs ls'], True),
    ('find . -ok ls {} \\;', ORDINARY, ['runs find', 'runs ls'], True),
    ('find . -follow -name x', ORDINARY, ['runs find'], True),
    ('find . -name x', SAFE, ['runs find'], True),
    ('date +%s 0101', ORDINARY, ['runs date'], True),
    ('date -X 0101', ORDINARY, ['runs date'], True),
    ('date -I 0101', ORDINARY, ['runs date'], True),
    ('date --date 2020-01-01', SAFE, ['runs date'], True),
    ('date --reference src/app.py', SAFE, ['runs date'], True),
    ('date -r src/app.py', SAFE, ['runs date'], True),
    ('date --file dates.txt', ORDINARY, ['runs date'], True),
    ('date -f dates.txt', ORDINARY, ['runs date'], True),
    ('date 0101', ORDINARY, ['runs date'], True),
    ('uniq - b', ORDINARY, ['runs uniq'], True),
    ('uniq a b', ORDINARY, ['runs uniq'], True),
    ('uniq a -', SAFE, ['runs uniq'], True),
    ('uniq -f 1 a', SAFE, ['runs uniq'], True),
    ('uniq -s 1 a', SAFE, ['runs uniq'], True),
    ('uniq -w 1 a', SAFE, ['runs uniq'], True),
    ('uniq --skip-fields 1 a', SAFE, ['runs uniq'], True),
    ('uniq --skip-chars 1 a', SAFE, ['runs uniq'], True),
    ('uniq --check-chars 1 a', SAFE, ['runs uniq'], True),
    ('uniq a .git/config', DANGEROUS, ['writes inside .git (.git/config)'], False),
    ('uniq a /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('xxd - out', ORDINARY, ['runs xxd'], True),
    ('xxd -c 8 a', SAFE, ['runs xxd'], True),
    ('xxd -g 2 a', SAFE, ['runs xxd'], True),
    ('xxd -l 8 a', SAFE, ['runs xxd'], True),
    ('xxd -o 8 a', SAFE, ['runs xxd'], True),
    ('xxd -s 8 a', SAFE, ['runs xxd'], True),
    ('xxd -n name -i a', SAFE, ['runs xxd'], True),
    ('xxd -R always a', SAFE, ['runs xxd'], True),
    ('xxd -r a .git/x', DANGEROUS, ['writes inside .git (.git/x)'], False),
    ('env -u X', SAFE, ['runs env'], True),
    ('env -0', SAFE, ['runs env'], True),
    ('git init a /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('git worktree add a /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('git config --show-origin user.name', SAFE, ['runs git'], True),
    ('awk -X \'BEGIN{system("ls")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk --assign x=1 \'BEGIN{system("ls")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk --field-separator , \'BEGIN{system("ls")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk -v x=1 \'BEGIN{system("ls")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk -F , \'BEGIN{system("ls")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ("awk -i inc.awk '{print}'", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk -l lib '{print}'", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk -E x.awk', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk -f x.awk', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk --include inc.awk '{print}'", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk --load lib '{print}'", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --exec x.awk', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk '/re/' src/app.py", SAFE, ['runs awk'], True),
    ("awk '{print}' /etc/x", ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", READ_CASES, ids=[c[0] for c in READ_CASES])
def test_where_commands_run_and_what_they_read(root: Path, cmd: str, level: int, reasons: list[str],
                                              coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


def test_home_and_parent_paths_are_named(root: Path) -> None:
    # Slip: "~" or ".." dropped from what makes an operand look like a path.
    home = Path(os.path.expanduser("~"))
    assert _judged("foo ~/x", root) == (ORDINARY, [f"names a path outside the workspace ({home / 'x'})"], False)
    assert _judged("foo ../x", root) == (ORDINARY, [f"names a path outside the workspace ({root.parent / 'x'})"], False)


def test_a_step_before_the_one_that_changes_the_shell_is_not_read_only(root: Path) -> None:
    # Slip: is_safe ignoring a taint set by a later step. `ls; shopt -s extdebug`: ls was judged
    # before shopt tainted the command, and the final pass must still keep it from SAFE.
    a = analyze("ls; shopt -s extdebug", root)
    assert [(s.program, s.level) for s in a.steps] == [("ls", ORDINARY), ("shopt", ORDINARY)]
    assert [(s.program, s.level) for s in analyze("ls; shopt -s nullglob", root).steps][0] == ("ls", SAFE)


@pytest.mark.parametrize("awk", ["awk", "gawk", "mawk", "nawk"])
def test_an_awk_program_is_not_taken_for_a_path(root: Path, tmp_path: Path, awk: str) -> None:
    # Slip: a name of the awk family left out of is_safe's awk case, so its program text is read
    # as a file name: '/re/' would be a path outside the workspace.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / awk).write_text("#!/bin/sh\n")
    (bin_ / awk).chmod(0o755)
    a = analyze(f"{awk} '/re/' src/app.py", root, env={"PATH": str(bin_)})
    assert (a.level, a.reasons(), a.steps[0].coverable) == (SAFE, [f"runs {awk}"], True)


@pytest.mark.parametrize("n,too_many", [(2000, False), (2001, True)])
def test_a_pattern_is_checked_up_to_two_thousand_matches(root: Path, n: int, too_many: bool) -> None:
    # Slip: the limit moved by one. 2000 matches are each judged; one more and the pattern is
    # reported as too wide to check, for a write (touch) and for a read (cat).
    many = root / "many"
    many.mkdir()
    for k in range(n):
        (many / f"f{k}").touch()
    w = analyze("touch many/*", root)
    r = analyze("cat many/*", root)
    assert ("writes many/*: the pattern matches too many files to check" in w.reasons()) is too_many
    # (The read check's answer is not a reason of its own: the step is only kept from SAFE.)
    assert (w.level, r.level) == ((UNKNOWN, ORDINARY) if too_many else (ORDINARY, SAFE))


def test_what_a_read_pattern_matches_is_judged_as_bash_expands_it(root: Path, tmp_path: Path) -> None:
    # Slips: hidden names matched by * (bash does not, without dotglob), the option-like name
    # check dropped, a pattern starting with a dash taken for a path.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "f").write_text("x")
    os.symlink(tmp_path / "out", root / ".hid")

    def steps(cmd: str) -> list[tuple]:
        return [(s.level, s.reasons, s.coverable) for s in analyze(cmd, root).steps]

    assert steps("cat *") == [(SAFE, [], True)]
    assert steps("cat */f") == [(SAFE, [], True)]
    assert steps("cat .h*/f") == [(ORDINARY, [f"reads outside the workspace ({root}/.hid/f)"], False)]
    assert steps("cat -*") == [(ORDINARY, [], True)]  # the pattern expands to options
    (root / "-rf").write_text("")
    assert steps("cat *") == [(ORDINARY, [], True)]  # matches a name that reads as an option
    assert steps("cat src/*") == [(SAFE, [], True)]


# Which words of grep, sed, jq ... name files (_path_words): not the pattern (the first operand,
# or -e's value), but -f's file, and with -f every operand. `grep -f /etc/x a` read a file
# outside the workspace as read-only (the -f value was passed over), and after -f the first
# operand was still taken for the pattern (`grep -f p /etc/y`); ag's -f is a flag.
PATTERN_CASES = [
    ('grep -f /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('grep --file /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('grep -f/etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('grep --file=/etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('grep -f p /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep -f p a', SAFE, ['runs grep'], True),
    ('rg -f /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('jq -f /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('ag -f x /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep -e /etc/x a', SAFE, ['runs grep'], True),
    ('grep /etc/x a', SAFE, ['runs grep'], True),
    ('grep -e x /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep --regexp x /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep --regexp=/etc/x a', SAFE, ['runs grep'], True),
    ('grep --expression x /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep -e/etc/x a', SAFE, ['runs grep'], True),
    ('grep -ex /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep -- /etc/x a', SAFE, ['runs grep'], True),
    ('grep -- -x /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep x - /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep -i x /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep -e x -e y /etc/z', ORDINARY, ['names a path outside the workspace (/etc/z)'], False),
    ('sed --expression=p /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('sed -e p -- -n /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('jq -e . /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('jq -ex /etc/y', SAFE, ['runs jq'], True),
    ('jq . /etc/y', ORDINARY, ['names a path outside the workspace (/etc/y)'], False),
    ('grep x .git/config', SAFE, ['runs grep'], True),
    ('grep -f p .git/config', SAFE, ['runs grep'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", PATTERN_CASES, ids=[c[0] for c in PATTERN_CASES])
def test_which_words_of_a_pattern_tool_are_files(root: Path, cmd: str, level: int, reasons: list[str],
                                                coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


# git's read-only forms (git_safe, _git_listing): the global options a read-only git may carry,
# and for the subcommands with a listing form, every word that makes them change something.
# `git config --show-origin --unset x`: the writing options and subcommands count even next to
# a reading one. `git reflog drop` (git 2.50) deletes a reflog like `delete`. (The forms
# test_classify_programs.py already lists are not repeated here.)
GIT_FORM_CASES = [
    ('git --no-pager', SAFE, ['runs git'], True),
    ('git -P', SAFE, ['runs git'], True),
    ('git -C src', SAFE, ['runs git'], True),
    ('git -c color.ui=never', SAFE, ['runs git'], True),
    ('git -c core.pager=less log', UNKNOWN, ['git -c core.pager can make git run programs'], False),
    ('git -C src -c color.ui=never log', SAFE, ['runs git'], True),
    ('git remote add x y', ORDINARY, ['runs git'], True),
    ('git remote -v add x y', ORDINARY, ['runs git'], True),
    ('git reflog list', SAFE, ['runs git'], True),
    ('git reflog drop x', DANGEROUS, ['deletes reflog entries (loses the way back)'], True),
    ("git reflog ''", SAFE, ['runs git'], True),
    ('git symbolic-ref HEAD', SAFE, ['runs git'], True),
    ('git symbolic-ref --short HEAD', SAFE, ['runs git'], True),
    ('git symbolic-ref -d HEAD', ORDINARY, ['runs git'], True),
    ('git symbolic-ref --delete HEAD', ORDINARY, ['runs git'], True),
    ('git symbolic-ref HEAD refs/heads/x', ORDINARY, ['runs git'], True),
    ('git config --show-origin --add x y', ORDINARY, ['runs git'], True),
    ('git config --show-origin --unset x', ORDINARY, ['runs git'], True),
    ('git config --show-origin --unset-all x', ORDINARY, ['runs git'], True),
    ('git config --show-origin --replace-all x y', ORDINARY, ['runs git'], True),
    ('git config --show-origin --rename-section a b', ORDINARY, ['runs git'], True),
    ('git config --show-origin --remove-section a', ORDINARY, ['runs git'], True),
    ('git config --show-origin --edit', ORDINARY, ['runs git'], True),
    ('git config --show-origin -e', ORDINARY, ['runs git'], True),
    ('git config --show-origin set x y', ORDINARY, ['runs git'], True),
    ('git config --show-origin unset x', ORDINARY, ['runs git'], True),
    ('git config --show-origin rename-section a b', ORDINARY, ['runs git'], True),
    ('git config --show-origin remove-section a', ORDINARY, ['runs git'], True),
    ('git config --show-origin edit', ORDINARY, ['runs git'], True),
    ('git config get x', SAFE, ['runs git'], True),
    ('git config --get-urlmatch x y', SAFE, ['runs git'], True),
    ('git config --show-origin user.name', SAFE, ['runs git'], True),
    ('git config user.name x', ORDINARY, ['runs git'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", GIT_FORM_CASES, ids=[c[0] for c in GIT_FORM_CASES])
def test_git_read_only_forms(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


def test_a_program_whose_name_starts_like_a_reason_stays_coverable(root: Path) -> None:
    # Slip: the read-only check's reason compared by a short opening ("names"): a program off
    # the list whose own name starts so ("namesake is not on the read-only list") lost its
    # "always". Only a read that leads out of the workspace makes a step not coverable here.
    for cmd in ("namesake x", "readsoutside x"):
        a = analyze(cmd, root)
        assert a.steps[0].coverable and a.steps[0].prefix == (cmd.split()[0],), cmd
        assert a.steps[0].unsafe == f"{cmd.split()[0]} is not on the read-only list"
