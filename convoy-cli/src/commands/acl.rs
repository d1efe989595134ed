//! `convoy acl`: the least-privilege `ACL SETUSER` line for a domain's
//! categories. Needs no connection.

use convoy_runtime::key::Escaped;

use crate::cli::AclArgs;
use crate::error::CliError;
use crate::render;

/// The `ACL SETUSER` line for the categories, after checking each is a
/// category convoy can have.
pub fn run(args: &AclArgs) -> Result<String, CliError> {
    acl(&args.categories, &args.user)
}

fn acl(categories: &[String], user: &str) -> Result<String, CliError> {
    for c in categories {
        convoy_runtime::key::check_category(c).map_err(|rule| {
            CliError::Usage(format!("{:?} is not a category: {rule}", Escaped(c)))
        })?;
    }
    if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CliError::Usage(format!(
            "--user {:?}: a Redis user name is one word",
            Escaped(user)
        )));
    }
    let names: Vec<&str> = categories.iter().map(String::as_str).collect();
    Ok(render::acl(user, &names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_checks_categories_and_user() {
        let line = acl(&["order".into()], "app").expect("acl");
        assert!(line.contains("ACL SETUSER app reset on >"), "{line}");
        let patterns = convoy_runtime::redis::acl::category_patterns("order").join(" ");
        assert!(line.contains(&format!(" {patterns} ")), "{line}");
        let own = convoy_runtime::redis::acl::own_patterns().join(" ");
        assert!(line.contains(&format!(" {own} ")), "{line}");
        let e = acl(&["convoy".into()], "app").expect_err("reserved");
        assert_eq!(e.exit_code(), 64);
        assert!(e.to_string().contains("`convoy` is reserved"), "{e}");
        assert!(acl(&["order".into()], "a b").is_err());
    }
}
