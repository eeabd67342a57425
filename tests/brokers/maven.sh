# Sourced by the broker scripts: fetch artifacts and their runtime dependencies from Maven
# Central with the machine's Maven, into a directory of jars.
#
#   maven_fetch WORK OUT NAME DEP...
#
# WORK: a scratch directory (its pom.xml and mvn.log are rewritten); OUT: where the jars go
# (replaced only on success, through OUT.tmp); NAME: the scratch project's artifactId; each DEP
# one "groupId:artifactId:version". Returns 1 (OUT untouched, mvn's last lines on stderr) if
# Maven fails; the caller checks that the jar it needs is there and names what it fetched.

maven_fetch() {
  local work=$1 out=$2 name=$3
  shift 3
  local deps="" dep g a v
  for dep in "$@"; do
    IFS=: read -r g a v <<<"$dep"
    deps+="    <dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"$'\n'
  done
  rm -rf "$work" "$out.tmp"
  mkdir -p "$work"
  cat >"$work/pom.xml" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tests</groupId>
  <artifactId>$name</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
$deps  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.8.1</version>
      </plugin>
    </plugins>
  </build>
</project>
POM
  if ! mvn -B -q -f "$work/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$out.tmp" >"$work/mvn.log" 2>&1; then
    tail -n 15 "$work/mvn.log" >&2 || true
    rm -rf "$out.tmp"
    return 1
  fi
}
