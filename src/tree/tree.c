/* Being written (issue 16). */
typedef int cap_placeholder_tree;
